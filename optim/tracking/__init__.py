"""What a run leaves behind in MLflow and Optuna's stores, and reading it back, one idea per module.

``runs`` (MLflow runs, params, metrics, artifacts; a run ended however the command ends), ``stores`` (shared
stores created once however many workers start), ``evaluation`` (an evaluate run's params and figures),
``models`` (the saved evaluator logged as MLflow models), ``report`` (tables and plots of a study or a run).
"""

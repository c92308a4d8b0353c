"""A judge certificate: how far people agree with each other on your data, whether the panel agrees with them at
least as well as one of them does, and the alternative annotator test.

``people``: several people's labels per item (per-annotator columns, one row per answer, MLflow review feedback).
``agreement``: Cohen's kappa per pair, Fleiss' kappa, Krippendorff's alpha, with bootstrap CIs over items, and the
panel beside each person. ``alt_test``: the alternative annotator test (Calderon, Reichart and Dror, ACL 2025).
"""

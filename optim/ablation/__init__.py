"""Which referee earns its cost, one idea per module.

``run`` (``chateval ablate`` as a function: the panel whole, each referee left out, each alone), ``paired`` (two
panels on the same items compared item by item), ``report`` (the ablation's table and plot, from its summary).
"""

"""The training loop: the Trainer, its options, the inner and outer loops, and export.

The inner loops run steps in `tf.function`s; the outer loop calls them and
runs the actions.
"""

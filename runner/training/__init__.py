"""The training loop: the Trainer, its options, the inner loops (steps in `tf.function`s), the outer loop and
its actions, and export."""

"""`--check_tpu`: on a CPU, what a TPU would reject of a config."""

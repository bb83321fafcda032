"""Example configs for `python -m runner --config=configs/NAME.py`."""

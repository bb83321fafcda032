"""What a run writes: checkpoints, progress lines and summaries, profiles, and which worker writes them."""

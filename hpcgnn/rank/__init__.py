"""What every rank runs: the entry point, the training loop and its components."""

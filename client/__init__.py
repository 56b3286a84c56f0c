"""The trainer side: iterator over the daemon's batches, device feeder, training loop."""

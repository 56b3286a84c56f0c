"""The producer side: readers, preparation, snapshot, augmentation workers, daemon."""

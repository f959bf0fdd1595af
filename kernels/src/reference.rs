//! Straightforward CPU reference implementations of every kernel (filled in by the augment work).

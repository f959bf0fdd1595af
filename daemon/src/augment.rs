//! augment (to be built).

//! dataset (to be built).

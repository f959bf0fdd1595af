//! sampler (to be built).

//! reader (to be built).

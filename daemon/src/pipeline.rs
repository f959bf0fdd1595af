//! pipeline (to be built).

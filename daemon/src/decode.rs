//! decode (to be built).

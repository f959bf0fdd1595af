//! Local storage: the batched reader (io_uring, `pread` fallback) and the open rules that keep
//! a read inside what the client may read (no symlink escape, no blocking opens).

pub mod fsopen;
pub mod reader;

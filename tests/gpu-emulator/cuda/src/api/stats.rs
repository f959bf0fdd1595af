//! `stoker_emu_live`: what is alive ([`crate::stats`]), asked from inside the process.

use super::api;
use crate::stats::{live, EmuLive};
use crate::status::{self, CUresult};

/// Emulator only: writes what is alive now into `*out`, whose `size` must be
/// `sizeof(EmuLive)`.
#[no_mangle]
pub extern "C" fn stoker_emu_live(out: *mut EmuLive) -> CUresult {
    api("stoker_emu_live", |a| {
        if out.is_null() {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: the caller passes an EmuLive whose first field says its size.
        if unsafe { (*out).size } != std::mem::size_of::<EmuLive>() as u64 {
            return Err(status::INVALID_VALUE);
        }
        let l = live(&a.lock());
        // SAFETY: checked non-null and of our size above.
        unsafe { out.write(l) };
        Ok(())
    })
}

//! What is alive in this process: contexts, streams, events, modules, device and pinned
//! memory, VMM allocations, mappings and reservations. Tests (and leak checks from outside) ask
//! through [`stoker_emu_live`](crate::api::stats::stoker_emu_live), or read
//! `$STOKER_EMU_STATS_DIR/<pid>.json`, rewritten (to a temporary name, then renamed) by
//! [`changed`] after every change. The file also counts asynchronous host-to-device copies by
//! their source's memory (`async_uploads_pageable`, `async_uploads_pinned`), so a test can
//! tell pinned staging from pageable, and gives each device's primary context flags
//! (`primary_ctx_flags`, as `cuDevicePrimaryCtxSetFlags_v2` set them).

use std::io::Write;

use crate::state::Emu;

/// What is alive. `size` must be set by the caller to `sizeof(EmuLive)` (versioning).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmuLive {
    /// `sizeof(EmuLive)`, set by the caller; `stoker_emu_live` refuses any other size.
    pub size: u64,
    /// Primary contexts retained at least once.
    pub contexts: u64,
    /// Streams created and not yet destroyed.
    pub streams: u64,
    /// Events created and not yet destroyed.
    pub events: u64,
    /// Modules loaded and not yet unloaded.
    pub modules: u64,
    /// `cuMemAlloc` allocations not yet freed.
    pub device_allocations: u64,
    /// Their bytes.
    pub device_bytes: u64,
    /// Pinned host allocations (`cuMemHostAlloc`) and registrations (`cuMemHostRegister`).
    pub pinned_allocations: u64,
    /// Their bytes.
    pub pinned_bytes: u64,
    /// `cuMemCreate` and imported allocations not yet released, or released but still mapped.
    pub vmm_allocations: u64,
    /// Their bytes.
    pub vmm_bytes: u64,
    /// Ranges mapped with `cuMemMap` and not yet unmapped.
    pub vmm_mappings: u64,
    /// Address ranges reserved with `cuMemAddressReserve` and not yet freed.
    pub reservations: u64,
}

/// What is alive now.
pub(crate) fn live(e: &Emu) -> EmuLive {
    let m = &e.mem;
    EmuLive {
        size: std::mem::size_of::<EmuLive>() as u64,
        contexts: e.devices.iter().filter(|d| d.ctx.refs > 0).count() as u64,
        streams: e.streams.len() as u64,
        events: e.events.len() as u64,
        modules: e.modules.len() as u64,
        device_allocations: m.device.len() as u64,
        device_bytes: m.device.values().map(|r| r.size).sum(),
        pinned_allocations: (m.pinned.len() + m.registered.len()) as u64,
        pinned_bytes: m
            .pinned
            .values()
            .chain(m.registered.values())
            .map(|r| r.size)
            .sum(),
        vmm_allocations: m.vmm.live().count() as u64,
        vmm_bytes: m.vmm.live().map(|a| a.size).sum(),
        vmm_mappings: m.vmm.mapping_count() as u64,
        reservations: m.vmm.reservations.len() as u64,
    }
}

/// Rewrites the stats file, if `STOKER_EMU_STATS_DIR` asks for one.
pub(crate) fn changed(e: &Emu) {
    let Some(dir) = std::env::var_os("STOKER_EMU_STATS_DIR").filter(|d| !d.is_empty()) else {
        return;
    };
    let l = live(e);
    let json = format!(
        "{{\"pid\": {}, \"contexts\": {}, \"streams\": {}, \"events\": {}, \"modules\": {}, \
         \"device_allocations\": {}, \"device_bytes\": {}, \"pinned_allocations\": {}, \
         \"pinned_bytes\": {}, \"vmm_allocations\": {}, \"vmm_bytes\": {}, \"vmm_mappings\": {}, \
         \"reservations\": {}, \"async_uploads_pageable\": {}, \"async_uploads_pinned\": {}, \
         \"primary_ctx_flags\": {:?}}}\n",
        std::process::id(),
        l.contexts,
        l.streams,
        l.events,
        l.modules,
        l.device_allocations,
        l.device_bytes,
        l.pinned_allocations,
        l.pinned_bytes,
        l.vmm_allocations,
        l.vmm_bytes,
        l.vmm_mappings,
        l.reservations,
        e.mem.async_uploads.0,
        e.mem.async_uploads.1,
        e.devices.iter().map(|d| d.ctx.flags).collect::<Vec<_>>()
    );
    let dir = std::path::PathBuf::from(dir);
    let pid = std::process::id();
    let tmp = dir.join(format!(".{pid}.json.tmp"));
    let write = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(json.as_bytes()));
    if write.is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("{pid}.json")));
    }
}

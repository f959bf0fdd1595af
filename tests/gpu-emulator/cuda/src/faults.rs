//! Faults on demand: the Nth call of a named driver function fails with a named status.
//!
//! # Design
//! Calls are counted per function name for the whole process, from `cuInit` on. Faults come
//! from the configuration (`STOKER_EMU_FAULTS`, `STOKER_EMU_CONFIG`) or, in-process, from
//! [`stoker_emu_inject_fault`](crate::api::faults::stoker_emu_inject_fault) (counted from the
//! moment it is called). Sticky statuses
//! (`CUDA_ERROR_ILLEGAL_ADDRESS`, `CUDA_ERROR_LAUNCH_FAILED`: the context;
//! `CUDA_ERROR_ECC_UNCORRECTABLE`: the whole device) break
//! what they break for every later call; injected into a call that enqueues stream work
//! (`cuLaunchKernel`, async copies) they surface when that work runs, as on a GPU.
//!
//! # Limitations
//! The name must be the exported symbol (`cuMemAlloc_v2`, not `cuMemAlloc`).

use std::collections::HashMap;

use crate::config::PlannedFault;
use crate::status::CUresult;

pub(crate) struct Faults {
    calls: HashMap<String, u64>,
    /// `nth` counts calls from `cuInit` on.
    planned: Vec<PlannedFault>,
}

impl Faults {
    pub(crate) fn new(planned: &[PlannedFault]) -> Faults {
        Faults {
            calls: HashMap::new(),
            planned: planned.to_vec(),
        }
    }

    /// Counts one call of `name`; the status to fail it with, if one is planned.
    pub(crate) fn hit(&mut self, name: &str) -> Option<CUresult> {
        let n = self.calls.entry(name.to_string()).or_insert(0);
        *n += 1;
        let n = *n;
        let at = self
            .planned
            .iter()
            .position(|f| f.call == name && f.nth == n)?;
        Some(self.planned.remove(at).status)
    }

    /// Plans a fault on the `nth` call of `name` from now on.
    pub(crate) fn plan(&mut self, name: &str, nth: u64, code: CUresult) {
        let done = self.calls.get(name).copied().unwrap_or(0);
        self.planned.push(PlannedFault {
            call: name.to_string(),
            nth: done + nth,
            status: code,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_call_fails_once() {
        let mut f = Faults::new(&[PlannedFault {
            call: "cuMemAlloc_v2".into(),
            nth: 2,
            status: 2,
        }]);
        assert_eq!(f.hit("cuMemAlloc_v2"), None);
        assert_eq!(f.hit("cuMemFree_v2"), None);
        assert_eq!(f.hit("cuMemAlloc_v2"), Some(2));
        assert_eq!(f.hit("cuMemAlloc_v2"), None);
        f.plan("cuMemAlloc_v2", 1, 700);
        assert_eq!(f.hit("cuMemAlloc_v2"), Some(700));
    }
}

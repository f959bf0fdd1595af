//! `stoker bench`'s printed table and SVG chart.
//!
//! # Design
//! - Pure functions of the [`FullReport`].
//!
//! # Limitations
//! - Fixed-width text; long dataset names widen the table.

#![forbid(unsafe_code)]

use super::*;

/// The transform in a table's title: `RandomResizedCrop+flip 224 f32 nchw`.
pub(super) fn transform(spec: &PipelineSpec) -> String {
    let crop = match spec.crop {
        Crop::RandomResized { .. } => "RandomResizedCrop+flip",
        _ => "Resize+CenterCrop",
    };
    let dtype_layout = format!("{:?} {:?}", spec.dtype, spec.layout).to_lowercase();
    format!("{crop} {} {dtype_layout}", spec.crop.output_size().1)
}

pub(super) fn table(r: &FullReport) -> String {
    let mut s = format!(
        "stoker bench {}: {} samples ({}, {} files), backend {}, reader {}, batch {}, {}, \
         {} threads\n",
        r.dataset,
        r.index.samples,
        r.index.kind,
        r.index.files,
        r.backend,
        r.read_with,
        r.spec.batch_size,
        transform(&r.spec),
        r.decode_threads,
    );
    if r.pipeline.is_some() {
        s += &format!(
            "timing: {} warm-up + {} timed epochs per warm run, one epoch per cold run\n",
            r.warmup_epochs, r.timed_epochs
        );
    }
    s += &format!(
        "indexing: walk {:.3}s{}, from the index cache {:.3}s{}\n\n",
        r.index.walk_s,
        r.index
            .walk_cold_s
            .map_or(String::new(), |c| format!(" (cold caches {c:.3}s)")),
        r.index.cached_s,
        if r.index.cache_hit {
            ""
        } else {
            " (cache miss)"
        }
    );
    if r.eviction == Some(Eviction::NodeCache) {
        s += "cold rows: the objects' copies deleted from the node cache first (read from the \
              server); warm rows read the node cache\n\n";
    }
    s += &stage_rows(&r.stages);
    for e in &r.end_to_end {
        s += &format!(
            "{:<28} {:>6} {:>7} {:>10.1} {:>9.1} {:>12}   wait p50 {:.2} ms, p99 {:.2} ms\n",
            format!(
                "end to end ({} client{})",
                e.clients,
                if e.clients == 1 { "" } else { "s" }
            ),
            e.cache,
            r.decode_threads,
            e.images_per_s,
            e.mb_per_s,
            e.cpu_s_per_1000.map_or("-".into(), |c| format!("{c:.2}")),
            e.wait_p50_ms,
            e.wait_p99_ms
        );
    }
    s += &failures(&r.stages);
    if let Some(p) = r.pipeline.as_ref().filter(|p| p.bad_samples > 0) {
        s += &format!(
            "pipeline (in-process): {} bad samples replaced (as the daemon replaces them)\n",
            p.bad_samples
        );
    }
    s += MB_PER_S_NOTE;
    if let Some(v) = &r.verdict {
        s += &format!("\nverdict: {}\n", v.line);
    }
    if let Some(e) = r.end_to_end.first() {
        s += &format!(
            "peak RSS: daemon {}, client {:.1} MB, bench process {:.1} MB\n",
            e.daemon_peak_rss_mb
                .map_or("unknown".into(), |m| format!("{m:.1} MB")),
            e.client_peak_rss_mb,
            r.bench_peak_rss_mb.unwrap_or(0.0)
        );
    }
    s += &scaling_and_peers(r);
    s
}

/// The header and one row per stage.
fn stage_rows(stages: &[StageResult]) -> String {
    let mut s = format!(
        "{:<28} {:>6} {:>7} {:>10} {:>9} {:>12}\n",
        "stage", "cache", "threads", "images/s", "MB/s", "CPU s/1000"
    );
    for st in stages {
        s += &format!(
            "{:<28} {:>6} {:>7} {:>10.1} {:>9.1} {:>12.2}\n",
            st.stage, st.cache, st.threads, st.images_per_s, st.mb_per_s, st.cpu_s_per_1000
        );
    }
    s
}

/// One line per stage row that failed on samples: those are not in its images/s.
fn failures(stages: &[StageResult]) -> String {
    stages
        .iter()
        .filter(|st| st.failed > 0)
        .map(|st| {
            format!(
                "{}: {} of {} failed (corrupt, or a format this stage does not decode); \
                 images/s counts the decoded ones\n",
                st.stage.name(),
                st.failed,
                st.images + st.failed
            )
        })
        .collect()
}

/// Which bytes the MB/s column counts: not the same on every row.
pub(super) const MB_PER_S_NOTE: &str =
    "MB/s: stage rows count the compressed file bytes read (storage) \
     or decoded (decode, augment); end-to-end rows count the output bytes delivered to the \
     clients (images at the output size and dtype)\n";

/// The ceiling line, the scaling lines and the peers' figures, under the table.
fn scaling_and_peers(r: &FullReport) -> String {
    let mut s = r.ceiling.map_or_else(
        || Ceiling::not_shown(&r.stages).unwrap_or_default(),
        |c| c.line(),
    );
    let warm: Vec<&ServedResult> = r
        .end_to_end
        .iter()
        .filter(|e| e.cache == CacheState::Warm)
        .collect();
    if warm.len() > 1 {
        s += "scaling by clients: ";
        s += &warm
            .iter()
            .map(|e| format!("{} -> {:.1} img/s", e.clients, e.images_per_s))
            .collect::<Vec<_>>()
            .join(", ");
        s += "\n";
    }
    if !r.thread_scaling.is_empty() {
        s += "scaling by decode threads (in process): ";
        s += &r
            .thread_scaling
            .iter()
            .map(|t| format!("{} -> {:.1} img/s", t.threads, t.images_per_s))
            .collect::<Vec<_>>()
            .join(", ");
        s += "\n";
    }
    if !r.peers.is_empty() {
        s += "\npeers (same files, threads, batch and epochs, this run):\n";
        for peer in &r.peers {
            match (peer.images_per_s, peer.ratio) {
                (Some(v), Some(ratio)) => {
                    s += &format!(
                        "  {:<38} {:>8.1} img/s   stoker {:.2}x{}\n",
                        peer.name,
                        v,
                        ratio,
                        peer.against
                            .as_ref()
                            .map_or(String::new(), |a| format!(" ({a})"))
                    )
                }
                _ => {
                    s += &format!(
                        "  {:<38} failed: {}\n",
                        peer.name,
                        peer.error.as_deref().unwrap_or("?")
                    )
                }
            }
        }
    }
    s
}

pub(super) fn chart(r: &FullReport) -> String {
    let mut groups = vec![(
        "images/s by stage".to_string(),
        r.stages
            .iter()
            .map(|s| (format!("{} ({})", s.stage, s.cache), s.images_per_s))
            .chain(
                r.end_to_end
                    .iter()
                    .filter(|e| e.clients == 1)
                    .map(|e| (format!("end to end ({})", e.cache), e.images_per_s)),
            )
            .collect(),
    )];
    let warm: Vec<(String, f64)> = r
        .end_to_end
        .iter()
        .filter(|e| e.cache == CacheState::Warm)
        .map(|e| (format!("{} client(s)", e.clients), e.images_per_s))
        .collect();
    if !warm.is_empty() {
        groups.push(("end to end by client count".into(), warm));
    }
    if !r.thread_scaling.is_empty() {
        groups.push((
            "in-process pipeline by decode threads".into(),
            r.thread_scaling
                .iter()
                .map(|t| (format!("{} thread(s)", t.threads), t.images_per_s))
                .collect(),
        ));
    }
    let mut peers: Vec<(String, f64)> = r
        .peers
        .iter()
        .filter_map(|p| p.images_per_s.map(|v| (p.name.clone(), v)))
        .collect();
    if !peers.is_empty() {
        if let Some((name, v)) = ours(&r.end_to_end, r.pipeline.as_ref()) {
            peers.insert(0, (format!("stoker, {name}"), v));
        }
        groups.push(("stoker and the peers, same run".into(), peers));
    }
    svg_chart(
        &format!("stoker bench {}", r.dataset),
        r.verdict
            .as_ref()
            .map_or("storage only", |v| v.line.as_str()),
        &groups,
    )
}

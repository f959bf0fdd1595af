//! The bench's conclusions: the verdict (which stage limits throughput) and the SVG chart.
//!
//! # Design
//! - Pure functions of the measured rates, so they are tested on constructed figures.
//!
//! # Limitations
//! - The chart is a plain bar chart; no axes beyond images/s.

#![forbid(unsafe_code)]

use serde::Serialize;

// ---------------------------------------------------------------------------------------------
// The verdict.
// ---------------------------------------------------------------------------------------------

/// Which stage limits throughput, and how far the others are from it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Verdict {
    /// "storage", "decode", "augment" or "delivery".
    pub bottleneck: &'static str,
    /// Images/s each part could give alone: (part, images/s).
    pub capacity: Vec<(&'static str, f64)>,
    /// What to do about the bottleneck ([`advice`]).
    pub advice: &'static str,
    /// One line: "decode-bound: storage could give 3.1x more, augment 4.0x more; to go
    /// faster: ...".
    pub line: String,
}

/// What a user can do about `bottleneck` (a [`Verdict::bottleneck`]).
pub(super) fn advice(bottleneck: &str) -> &'static str {
    match bottleneck {
        "storage" => {
            "pack the files into tar shards (`stoker pack`: large sequential reads instead of \
             one small file each), or move the data to faster local storage (object storage \
             is read through the node cache)"
        }
        "decode" => {
            "give the daemon more cores (--threads), let CPU hosts decode for it as remote \
             workers (`stokerd --worker` there, `--remote-worker HOST:PORT` here; \
             docs/multi-host.md, `stoker bench --workers` measures them), or decode on the GPU \
             (the CUDA backend, `--backend cuda`)"
        }
        "augment" => {
            "output u8 (dtype u8) and normalise on the GPU, give the daemon more cores \
             (--threads), or let CPU hosts augment for it as remote workers (`stokerd \
             --worker` there, `--remote-worker HOST:PORT` here; docs/multi-host.md); the CUDA \
             backend augments on the GPU"
        }
        "delivery" => {
            "output u8 (4x fewer bytes a batch than f32) or read with more client processes \
             (ranks); a GPU rank's batches stay on its GPU with the CUDA backend"
        }
        _ => "",
    }
}

/// Names the bottleneck from the stage rates (images/s). Augment's own rate is derived from
/// decode and decode+augment (time per image is additive). `pipeline` and `end_to_end`, when
/// given, detect a delivery bottleneck: end to end well below what the pipeline makes in
/// process means the daemon-to-client path (or the clients) limits.
pub(crate) fn verdict(
    storage: f64,
    decode: f64,
    decode_augment: f64,
    pipeline: Option<f64>,
    end_to_end: Option<f64>,
) -> Verdict {
    let augment = if decode_augment > 0.0 && decode > decode_augment {
        1.0 / (1.0 / decode_augment - 1.0 / decode)
    } else {
        f64::INFINITY
    };
    let mut capacity = vec![
        ("storage", storage),
        ("decode", decode),
        ("augment", augment),
    ];
    if let (Some(p), Some(e)) = (pipeline, end_to_end) {
        if e < 0.7 * p {
            // Delivery can give no more than what was measured end to end.
            capacity.push(("delivery", e));
        }
    }
    let (bottleneck, min) =
        capacity.iter().copied().fold(
            ("storage", f64::INFINITY),
            |a, b| if b.1 < a.1 { b } else { a },
        );
    let others: Vec<String> = capacity
        .iter()
        .filter(|(name, _)| *name != bottleneck)
        .map(|(name, rate)| {
            if rate.is_finite() {
                format!("{name} could give {:.1}x more", rate / min.max(1e-9))
            } else {
                format!("{name} costs nothing measurable")
            }
        })
        .collect();
    let mut line = format!("{bottleneck}-bound: {}", others.join(", "));
    if let (Some(p), Some(e)) = (pipeline, end_to_end) {
        line.push_str(&format!(
            "; end to end delivers {:.2}x of the in-process pipeline",
            e / p.max(1e-9)
        ));
    }
    let advice = advice(bottleneck);
    line.push_str(&format!("; to go faster: {advice}"));
    Verdict {
        bottleneck,
        advice,
        capacity: capacity
            .into_iter()
            .map(|(n, r)| (n, if r.is_finite() { r } else { -1.0 }))
            .collect(),
        line,
    }
}

// ---------------------------------------------------------------------------------------------
// The SVG chart.
// ---------------------------------------------------------------------------------------------

/// A horizontal bar chart, one group per title: (group title, [(label, images/s)]).
pub(crate) fn svg_chart(
    title: &str,
    subtitle: &str,
    groups: &[(String, Vec<(String, f64)>)],
) -> String {
    const W: f64 = 760.0;
    const LABEL_W: f64 = 230.0;
    const BAR_H: f64 = 20.0;
    const GAP: f64 = 6.0;
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut y = 58.0;
    let mut body = String::new();
    let colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"];
    for (g, (gtitle, bars)) in groups.iter().enumerate() {
        // Each group has its own scale: storage runs orders of magnitude above decode.
        let max = bars.iter().map(|b| b.1).fold(1.0f64, f64::max);
        body.push_str(&format!(
            "<text x=\"10\" y=\"{:.0}\" font-weight=\"bold\">{}</text>\n",
            y + 14.0,
            esc(gtitle)
        ));
        y += 24.0;
        for (label, v) in bars {
            let w = (W - LABEL_W - 110.0) * v / max;
            body.push_str(&format!(
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
                 <rect x=\"{LABEL_W:.0}\" y=\"{y:.0}\" width=\"{w:.1}\" height=\"{BAR_H:.0}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.0}\">{:.0} img/s</text>\n",
                LABEL_W - 8.0,
                y + 15.0,
                esc(label),
                colours[g % colours.len()],
                LABEL_W + w + 6.0,
                y + 15.0,
                v
            ));
            y += BAR_H + GAP;
        }
        y += 10.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W:.0}\" height=\"{:.0}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"46\">{}</text>\n{body}</svg>\n",
        y + 10.0,
        esc(title),
        esc(subtitle)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_says_what_to_do_about_each_bottleneck() {
        // (storage, decode, decode+augment, pipeline, end to end) -> bottleneck, advice.
        let cases = [
            ((100.0, 900.0, 800.0, None, None), "storage", "stoker pack"),
            (
                (5000.0, 300.0, 290.0, None, None),
                "decode",
                "the CUDA backend",
            ),
            ((5000.0, 3000.0, 400.0, None, None), "augment", "output u8"),
            (
                (5000.0, 3000.0, 2900.0, Some(2900.0), Some(500.0)),
                "delivery",
                "more client",
            ),
        ];
        for ((storage, decode, both, pipeline, e2e), bottleneck, want) in cases {
            let v = verdict(storage, decode, both, pipeline, e2e);
            assert_eq!(v.bottleneck, bottleneck, "{}", v.line);
            assert!(
                v.line.starts_with(&format!("{bottleneck}-bound: ")),
                "{}",
                v.line
            );
            assert!(v.line.contains("; to go faster: "), "{}", v.line);
            assert!(v.line.contains(want), "{}", v.line);
        }
        assert!(advice("decode").contains("--backend cuda"));
        assert!(advice("decode").contains("--threads"));
    }
}

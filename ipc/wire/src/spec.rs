//! The pipeline spec: what a batch is.
//!
//! A spec is sent by every rank when it attaches; ranks of one job must send identical specs.
//! It is serialisable (serde, JSON on the wire and in config), versioned, and validated by
//! [`PipelineSpec::validate`] before anything uses it.
//!
//! # Design
//! - Normalisation follows torchvision: `out = (px / 255 - mean) / std` with `mean`/`std` in
//!   the 0..1 scale. It applies to float outputs only; `u8` output is the resized pixels as-is.
//! - Sizes are `(height, width)` like torchvision.
//! - Several views of one image (self-supervised training): view 0 is the spec's `crop` and
//!   `flip_prob`; `extra_views` lists views 1.. (each its own crop and flip probability; the
//!   dtype, layout and normalisation are the spec's). Each view is its own tensor of the
//!   batch, its random draws keyed by [`view_seed`]. A one-view spec has no `extra_views` in
//!   its JSON, so it reads and writes as before.
//! - A view may add torchvision's per-sample operations after its crop (`ops`), a
//!   `RandomErasing` on its converted output (`erasing`), and the batch a MixUp or CutMix
//!   (`batch_mix`, which makes the labels soft): see [`Op`]. Each is left out of the JSON
//!   when unused, so a spec without them reads and writes as before.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

mod ops;
mod validate;
pub use ops::{
    AutoAugmentPolicy, BatchMix, Erasing, ErasingValue, Interpolation, Op, OpError, RandomWord,
    MAX_CLASSES, MAX_OPS, MAX_OP_DEPTH,
};
pub use validate::SpecError;

/// The spec version this build writes and accepts.
pub(crate) const SPEC_VERSION: u32 = 1;

/// ImageNet channel means (RGB, 0..1 scale), torchvision's defaults.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet channel standard deviations (RGB, 0..1 scale).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Largest batch a spec may ask for.
pub const MAX_BATCH_SIZE: u32 = 65_536;
/// Largest output side a spec may ask for.
pub const MAX_OUTPUT_SIDE: u32 = 16_384;

/// Element type of the output images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 8-bit unsigned, the resized pixels as-is (no normalisation).
    U8,
    /// IEEE half precision, normalised.
    F16,
    /// bfloat16, normalised.
    Bf16,
    /// IEEE single precision, normalised.
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 => 4,
        }
    }

    /// The spelling of the spec's JSON and of messages (`u8`, `f16`, `bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
        }
    }
}

/// Memory layout of one output batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `[batch, channel, height, width]` (PyTorch's default).
    Nchw,
    /// `[batch, height, width, channel]`.
    Nhwc,
}

/// How the output crop is taken from the decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Crop {
    /// torchvision's `RandomResizedCrop(size, scale, ratio, antialias=True)`.
    RandomResized {
        /// Output `(height, width)`.
        size: [u32; 2],
        /// Range of the crop's area as a fraction of the image's.
        scale: [f32; 2],
        /// Range of the crop's aspect ratio (width / height).
        ratio: [f32; 2],
    },
    /// Evaluation: `Resize(resize)` (shorter side) then `CenterCrop(size)`.
    CenterCrop {
        /// The shorter side after the resize.
        resize: u32,
        /// Output `(height, width)`.
        size: [u32; 2],
    },
}

impl Crop {
    /// torchvision's training default: RandomResizedCrop(224), scale (0.08, 1), ratio (3/4, 4/3).
    pub fn random_resized(side: u32) -> Crop {
        Crop::RandomResized {
            size: [side, side],
            scale: [0.08, 1.0],
            ratio: [3.0 / 4.0, 4.0 / 3.0],
        }
    }

    /// torchvision's evaluation default: Resize(side * 256 / 224) + CenterCrop(side).
    pub fn center(side: u32) -> Crop {
        Crop::CenterCrop {
            resize: side * 256 / 224,
            size: [side, side],
        }
    }

    /// Output `(height, width)`.
    pub fn output_size(&self) -> (u32, u32) {
        match *self {
            Crop::RandomResized { size, .. } | Crop::CenterCrop { size, .. } => (size[0], size[1]),
        }
    }
}

/// Most views one spec may ask for (view 0 and 15 extra views).
pub const MAX_VIEWS: usize = 16;

/// One more view of each image: its own crop, flip probability, operations and erasing (see
/// the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// How this view's crop is taken.
    pub crop: Crop,
    /// Probability of a horizontal flip, 0..=1.
    #[serde(default = "default_flip")]
    pub flip_prob: f32,
    /// Operations on this view's pixels after its crop, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<Op>,
    /// `RandomErasing` on this view's converted output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasing: Option<Erasing>,
}

impl View {
    /// A view with this crop and flip probability and nothing else.
    pub fn new(crop: Crop, flip_prob: f32) -> View {
        View {
            crop,
            flip_prob,
            ops: Vec::new(),
            erasing: None,
        }
    }
}

/// The seed view `view`'s random draws (crop box, flip) are keyed by in a job of `seed`:
/// `seed` itself for view 0 (so a one-view job draws as before), a SplitMix64 mix of the two
/// for the others. A one-view job of this seed, with the view's crop, draws the same boxes.
pub fn view_seed(seed: u64, view: usize) -> u64 {
    if view == 0 {
        return seed;
    }
    let mut z = seed ^ (view as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a batch is. See the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The spec format's version; this build accepts only its own (1).
    #[serde(default = "default_version")]
    pub version: u32,
    /// Samples per batch, 1..=[`MAX_BATCH_SIZE`].
    pub batch_size: u32,
    /// How view 0's crop is taken.
    pub crop: Crop,
    /// Probability of a horizontal flip, 0..=1.
    #[serde(default = "default_flip")]
    pub flip_prob: f32,
    /// Per-channel mean (RGB, 0..1 scale) subtracted from float outputs; ImageNet's by default.
    #[serde(default = "default_mean")]
    pub mean: [f32; 3],
    /// Per-channel standard deviation (RGB, 0..1 scale) float outputs are divided by; finite,
    /// non-zero; ImageNet's by default.
    #[serde(default = "default_std")]
    pub std: [f32; 3],
    /// Element type of the output images; f32 by default.
    #[serde(default = "default_dtype")]
    pub dtype: DType,
    /// Memory layout of the output batch; NCHW by default.
    #[serde(default = "default_layout")]
    pub layout: Layout,
    /// Drop each rank's final incomplete batch (and the sampler's uneven tail).
    #[serde(default)]
    pub drop_last: bool,
    /// Epochs to serve; `None` serves until the client detaches.
    #[serde(default)]
    pub epochs: Option<u32>,
    /// Each epoch in a new random order (training), or in dataset order (evaluation). Either
    /// way the ranks take DistributedSampler's interleaved shares of it.
    #[serde(default = "default_shuffle")]
    pub shuffle: bool,
    /// Show each image as its EXIF orientation says (Pillow's `ImageOps.exif_transpose`,
    /// torchcodec's default) before the crop is drawn. Off by default: pixels in stored order,
    /// as torchvision's `decode_jpeg` and DALI give them. Left out of the JSON when off, so a
    /// spec that does not use it reads as before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub exif_orientation: bool,
    /// Per-sample fields served beside the images, in this order: a WebDataset key's other
    /// members by extension (`"txt"`, `"json"`, `"cls"`, `"seg.png"`), byte-exact in the slot.
    /// Left out of the JSON when empty, so a spec that asks for none reads as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// Most bytes one field of one sample may have: each (sample, field) has this much room in
    /// the slot, and a longer field is that sample's field error (see `ring::FieldStatus`).
    /// Left out of the JSON at its default.
    #[serde(
        default = "default_field_max_bytes",
        skip_serializing_if = "is_default_field_max_bytes"
    )]
    pub field_max_bytes: u32,
    /// Views 1.. of each image (view 0 is `crop` with `flip_prob`), each its own tensor of the
    /// batch. Left out of the JSON when empty, so a one-view spec reads as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_views: Vec<View>,
    /// Operations on view 0's pixels after its crop, in order ([`Op`]). Left out of the JSON
    /// when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<Op>,
    /// `RandomErasing` on view 0's converted output. Left out of the JSON when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasing: Option<Erasing>,
    /// MixUp / CutMix over each batch; the labels are then soft (`batch x num_classes`
    /// floats). Left out of the JSON when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_mix: Option<BatchMix>,
}

/// Room for one field of one sample unless the spec says otherwise: a caption or a small
/// JSON record.
pub(crate) const DEFAULT_FIELD_MAX_BYTES: u32 = 4096;
/// Most fields a spec may ask for.
pub(crate) const MAX_FIELDS: usize = 16;
/// Longest field name (an extension).
pub const MAX_FIELD_NAME: usize = 64;
/// Largest `field_max_bytes`.
pub(crate) const MAX_FIELD_BYTES: u32 = 16 << 20;
/// Most bytes of fields one slot may hold (`batch_size * fields * field_max_bytes`).
pub(crate) const MAX_SLOT_FIELD_BYTES: u64 = 1 << 30;
/// Most bytes of soft labels one slot may hold (`batch_size * num_classes * 4`).
pub(crate) const MAX_SLOT_SOFT_LABEL_BYTES: u64 = 1 << 30;

fn default_field_max_bytes() -> u32 {
    DEFAULT_FIELD_MAX_BYTES
}

fn is_default_field_max_bytes(v: &u32) -> bool {
    *v == DEFAULT_FIELD_MAX_BYTES
}

fn is_false(v: &bool) -> bool {
    !v
}

fn default_version() -> u32 {
    SPEC_VERSION
}
fn default_shuffle() -> bool {
    true
}
fn default_flip() -> f32 {
    0.5
}
fn default_mean() -> [f32; 3] {
    IMAGENET_MEAN
}
fn default_std() -> [f32; 3] {
    IMAGENET_STD
}
fn default_dtype() -> DType {
    DType::F32
}
fn default_layout() -> Layout {
    Layout::Nchw
}

impl PipelineSpec {
    /// The standard training transform: RandomResizedCrop(side), flip 0.5, ImageNet
    /// normalisation, f32 NCHW.
    pub fn train(batch_size: u32, side: u32) -> PipelineSpec {
        PipelineSpec {
            version: SPEC_VERSION,
            batch_size,
            crop: Crop::random_resized(side),
            flip_prob: 0.5,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            dtype: DType::F32,
            layout: Layout::Nchw,
            drop_last: false,
            epochs: None,
            shuffle: true,
            exif_orientation: false,
            fields: Vec::new(),
            field_max_bytes: DEFAULT_FIELD_MAX_BYTES,
            extra_views: Vec::new(),
            ops: Vec::new(),
            erasing: None,
            batch_mix: None,
        }
    }

    /// The spec of view `view` alone: this spec with that view's crop, flip probability,
    /// operations and erasing, and no extra views (what one view's crop, resize and output
    /// follow).
    ///
    /// # Panics
    /// If `view` is not below [`PipelineSpec::view_count`].
    pub fn view_spec(&self, view: usize) -> PipelineSpec {
        let one = PipelineSpec {
            extra_views: Vec::new(),
            ..self.clone()
        };
        match view {
            0 => one,
            v => {
                let extra = self.extra_views[v - 1].clone();
                PipelineSpec {
                    crop: extra.crop,
                    flip_prob: extra.flip_prob,
                    ops: extra.ops,
                    erasing: extra.erasing,
                    ..one
                }
            }
        }
    }

    /// Whether the labels are soft (`batch x num_classes` floats): a batch mix is asked for.
    pub fn soft_labels(&self) -> Option<u32> {
        self.batch_mix.as_ref().map(BatchMix::num_classes)
    }

    /// How many views (tensors) each batch has: 1 plus the extra views.
    pub fn view_count(&self) -> usize {
        1 + self.extra_views.len()
    }

    /// The standard evaluation transform: Resize + CenterCrop, no flip, dataset order.
    pub fn eval(batch_size: u32, side: u32) -> PipelineSpec {
        PipelineSpec {
            crop: Crop::center(side),
            flip_prob: 0.0,
            shuffle: false,
            ..PipelineSpec::train(batch_size, side)
        }
    }

    /// Bytes of one output image.
    pub fn image_bytes(&self) -> usize {
        let (h, w) = self.crop.output_size();
        h as usize * w as usize * 3 * self.dtype.size()
    }

    /// Names the first field in which `other` differs from `self`, for the error a rank gets
    /// when its spec disagrees with the job's.
    pub fn first_difference(&self, other: &PipelineSpec) -> Option<&'static str> {
        if self.version != other.version {
            Some("version")
        } else if self.batch_size != other.batch_size {
            Some("batch_size")
        } else if self.crop != other.crop {
            Some("crop")
        } else if self.flip_prob != other.flip_prob {
            Some("flip_prob")
        } else if self.mean != other.mean {
            Some("mean")
        } else if self.std != other.std {
            Some("std")
        } else if self.dtype != other.dtype {
            Some("dtype")
        } else if self.layout != other.layout {
            Some("layout")
        } else if self.drop_last != other.drop_last {
            Some("drop_last")
        } else if self.epochs != other.epochs {
            Some("epochs")
        } else if self.exif_orientation != other.exif_orientation {
            Some("exif_orientation")
        } else if self.fields != other.fields {
            Some("fields")
        } else if self.field_max_bytes != other.field_max_bytes {
            Some("field_max_bytes")
        } else if self.extra_views != other.extra_views {
            Some("extra_views")
        } else if self.ops != other.ops {
            Some("ops")
        } else if self.erasing != other.erasing {
            Some("erasing")
        } else if self.batch_mix != other.batch_mix {
            Some("batch_mix")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_through_json() {
        let spec = PipelineSpec::train(64, 224);
        spec.validate().unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        let back: PipelineSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(spec, back);
        PipelineSpec::eval(8, 224).validate().unwrap();
        assert_eq!(spec.image_bytes(), 224 * 224 * 3 * 4);
    }

    #[test]
    fn minimal_json_takes_defaults() {
        let spec: PipelineSpec = serde_json::from_str(
            r#"{"batch_size": 4, "crop": {"kind": "center_crop", "resize": 256, "size": [224, 224]}}"#,
        )
        .unwrap();
        assert_eq!(spec.dtype, DType::F32);
        assert_eq!(spec.flip_prob, 0.5);
        spec.validate().unwrap();
    }

    #[test]
    fn exif_orientation_is_off_by_default_and_written_only_when_on() {
        let off = PipelineSpec::train(4, 32);
        assert!(!off.exif_orientation);
        assert!(!serde_json::to_string(&off).unwrap().contains("exif"));
        let on = PipelineSpec {
            exif_orientation: true,
            ..off.clone()
        };
        let text = serde_json::to_string(&on).unwrap();
        assert!(text.contains(r#""exif_orientation":true"#), "{text}");
        assert_eq!(serde_json::from_str::<PipelineSpec>(&text).unwrap(), on);
        assert_eq!(off.first_difference(&on), Some("exif_orientation"));
    }

    #[test]
    fn fields_are_written_only_when_asked_and_checked() {
        let off = PipelineSpec::train(4, 32);
        let text = serde_json::to_string(&off).unwrap();
        assert!(!text.contains("field"), "{text}");
        let on = PipelineSpec {
            fields: vec!["txt".into(), "seg.png".into()],
            field_max_bytes: 100,
            ..off.clone()
        };
        on.validate().unwrap();
        let text = serde_json::to_string(&on).unwrap();
        assert!(
            text.contains(r#""fields":["txt","seg.png"],"field_max_bytes":100"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<PipelineSpec>(&text).unwrap(), on);
        assert_eq!(off.first_difference(&on), Some("fields"));
        let refused = |fields: &[&str], max: u32| {
            let spec = PipelineSpec {
                fields: fields.iter().map(|f| f.to_string()).collect(),
                field_max_bytes: max,
                ..off.clone()
            };
            spec.validate().unwrap_err().to_string()
        };
        assert!(refused(&["TXT"], 10).contains(r#"fields[0] "TXT""#));
        assert!(refused(&["txt", ".json"], 10).contains("fields[1]"));
        assert!(refused(&["txt", "txt"], 10).contains("twice"));
        assert!(refused(&[""], 10).contains("1 to 64"));
        assert!(refused(&["txt"], 0).contains("field_max_bytes"));
        let many: Vec<String> = (0..17).map(|i| format!("f{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(refused(&many, 10).contains("at most 16"));
        let big = PipelineSpec {
            batch_size: 65_536,
            fields: vec!["a".into(), "b".into()],
            field_max_bytes: MAX_FIELD_BYTES,
            ..off
        };
        assert!(matches!(big.validate(), Err(SpecError::FieldSlotBytes(_))));
    }

    #[test]
    fn extra_views_are_written_only_when_asked_and_checked() {
        let one = PipelineSpec::train(4, 32);
        assert!(!serde_json::to_string(&one).unwrap().contains("views"));
        assert_eq!(one.view_count(), 1);
        assert_eq!(one.view_spec(0), one);
        let local = View {
            crop: Crop::RandomResized {
                size: [16, 16],
                scale: [0.05, 0.4],
                ratio: [0.75, 1.25],
            },
            flip_prob: 0.25,
            ops: Vec::new(),
            erasing: None,
        };
        let many = PipelineSpec {
            extra_views: vec![local.clone(); 3],
            ..one.clone()
        };
        many.validate().unwrap();
        let text = serde_json::to_string(&many).unwrap();
        assert_eq!(serde_json::from_str::<PipelineSpec>(&text).unwrap(), many);
        assert_eq!(many.view_count(), 4);
        assert_eq!(many.view_spec(0), one);
        assert_eq!(many.view_spec(2).crop, local.crop);
        assert_eq!(many.view_spec(2).flip_prob, 0.25);
        assert!(many.view_spec(3).extra_views.is_empty());
        assert_eq!(one.first_difference(&many), Some("extra_views"));
        let bad = |view: View| {
            let spec = PipelineSpec {
                extra_views: vec![local.clone(), view],
                ..one.clone()
            };
            spec.validate().unwrap_err().to_string()
        };
        let err = bad(View {
            flip_prob: 2.0,
            ..local.clone()
        });
        assert!(err.contains("extra_views[1]: flip_prob"), "{err}");
        let err = bad(View {
            crop: Crop::random_resized(0),
            ..local.clone()
        });
        assert!(err.contains("extra_views[1]: crop size"), "{err}");
        let too_many = PipelineSpec {
            extra_views: vec![local.clone(); MAX_VIEWS],
            ..one
        };
        assert_eq!(too_many.validate(), Err(SpecError::ViewCount(MAX_VIEWS)));
        assert_eq!(view_seed(7, 0), 7);
        assert_ne!(view_seed(7, 1), view_seed(7, 2));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<PipelineSpec>(
            r#"{"batch_size": 4, "crop": {"kind": "center_crop", "resize": 256, "size": [224, 224]}, "colour": 1}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut spec = PipelineSpec::train(0, 224);
        assert_eq!(spec.validate(), Err(SpecError::BatchSize(0)));
        spec.batch_size = 2;
        spec.flip_prob = 1.5;
        assert_eq!(spec.validate(), Err(SpecError::FlipProb(1.5)));
        spec.flip_prob = 0.5;
        spec.crop = Crop::RandomResized {
            size: [224, 224],
            scale: [0.5, 0.1],
            ratio: [0.75, 1.33],
        };
        assert!(spec.validate().unwrap_err().to_string().contains("scale"));
        spec.crop = Crop::CenterCrop {
            resize: 100,
            size: [224, 224],
        };
        assert!(spec.validate().unwrap_err().to_string().contains("resize"));
    }

    #[test]
    fn first_difference_names_the_field() {
        let a = PipelineSpec::train(64, 224);
        let mut b = a.clone();
        assert_eq!(a.first_difference(&b), None);
        b.dtype = DType::Bf16;
        assert_eq!(a.first_difference(&b), Some("dtype"));
    }
}

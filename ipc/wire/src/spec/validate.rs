//! What a valid [`PipelineSpec`] is, and why a spec is not ([`SpecError`]): every field is
//! checked before anything uses the spec, and the error names the first field that is off.

#![forbid(unsafe_code)]

use super::ops::check_ops;
use super::{
    BatchMix, Crop, DType, OpError, PipelineSpec, MAX_BATCH_SIZE, MAX_FIELDS, MAX_FIELD_BYTES,
    MAX_FIELD_NAME, MAX_OUTPUT_SIDE, MAX_SLOT_FIELD_BYTES, MAX_SLOT_SOFT_LABEL_BYTES, MAX_VIEWS,
    SPEC_VERSION,
};

/// A spec that cannot be served; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// `version` is not this build's.
    #[error("spec version {0} is not supported (this build speaks {SPEC_VERSION})")]
    Version(u32),
    /// `batch_size` is 0 or over [`MAX_BATCH_SIZE`].
    #[error("batch_size must be 1..={MAX_BATCH_SIZE}, got {0}")]
    BatchSize(u32),
    /// A crop's output `(height, width)` has a side of 0 or over [`MAX_OUTPUT_SIDE`].
    #[error("crop size must be 1..={MAX_OUTPUT_SIDE} on each side, got {0}x{1}")]
    OutputSize(u32, u32),
    /// A random resized crop's `scale` or `ratio` is not a finite, increasing, positive range.
    #[error("crop.{field} must be a finite, increasing, positive range, got [{lo}, {hi}]")]
    Range {
        /// `scale` or `ratio`.
        field: &'static str,
        /// The range's low end.
        lo: f32,
        /// The range's high end.
        hi: f32,
    },
    /// A center crop's `resize` is below the crop's smaller side or over [`MAX_OUTPUT_SIDE`].
    #[error("crop.resize must be at least the crop size ({size}), got {resize}")]
    Resize {
        /// The `resize` asked for.
        resize: u32,
        /// The crop's smaller side.
        size: u32,
    },
    /// A flip probability is outside 0..=1.
    #[error("flip_prob must be within 0..=1, got {0}")]
    FlipProb(f32),
    /// `std[channel]` is not finite or is zero.
    #[error("std[{0}] must be finite and non-zero, got {1}")]
    Std(usize, f32),
    /// `mean[channel]` is not finite.
    #[error("mean[{0}] must be finite, got {1}")]
    Mean(usize, f32),
    /// `epochs` is `Some(0)`.
    #[error("epochs must be at least 1 when given")]
    Epochs,
    /// A field name is malformed or repeated.
    #[error("fields[{index}] {name:?}: {reason}")]
    Field {
        /// Its place in `fields`.
        index: usize,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// More fields than [`MAX_FIELDS`] are asked for.
    #[error("fields: at most {MAX_FIELDS} may be asked for, got {0}")]
    FieldCount(usize),
    /// `field_max_bytes` is 0 or over [`MAX_FIELD_BYTES`].
    #[error("field_max_bytes must be 1..={MAX_FIELD_BYTES}, got {0}")]
    FieldMaxBytes(u32),
    /// More extra views than `MAX_VIEWS - 1` are asked for.
    #[error("extra_views: at most {max} may be asked for, got {0}", max = MAX_VIEWS - 1)]
    ViewCount(usize),
    /// An extra view's crop or flip probability is invalid.
    #[error("extra_views[{index}]: {reason}")]
    View {
        /// Its place in `extra_views` (view `index + 1`).
        index: usize,
        /// What is wrong with it.
        #[source]
        reason: Box<SpecError>,
    },
    /// An operation, erasing or batch mix is invalid.
    #[error(transparent)]
    Op(#[from] OpError),
    /// A batch mix is asked for with `u8` output (torchvision mixes float images).
    #[error(
        "batch_mix needs a float dtype (f32, f16 or bf16): MixUp and CutMix blend images, got u8"
    )]
    MixDType,
    /// The soft labels take more room in a slot than [`MAX_SLOT_SOFT_LABEL_BYTES`].
    #[error("batch_mix: the soft labels take {0} bytes a slot (batch_size * num_classes * 4), over the limit of {MAX_SLOT_SOFT_LABEL_BYTES}")]
    SoftLabelBytes(u64),
    /// CutMix is asked for over views of different sizes (its box is one box of one size,
    /// as torchvision's `query_size` requires).
    #[error(
        "batch_mix: CutMix needs every view at one size, view 0 is {0}x{1} and view {2} is {3}x{4}"
    )]
    MixViewSizes(u32, u32, usize, u32, u32),
    /// The fields take more room in a slot than [`MAX_SLOT_FIELD_BYTES`].
    #[error("fields take {0} bytes a slot (batch_size * fields * field_max_bytes), over the limit of {MAX_SLOT_FIELD_BYTES}")]
    FieldSlotBytes(u64),
}

impl PipelineSpec {
    /// Checks every field; the error names the first field that is off.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.version != SPEC_VERSION {
            return Err(SpecError::Version(self.version));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(SpecError::BatchSize(self.batch_size));
        }
        check_crop(&self.crop)?;
        if !(0.0..=1.0).contains(&self.flip_prob) {
            return Err(SpecError::FlipProb(self.flip_prob));
        }
        if self.extra_views.len() >= MAX_VIEWS {
            return Err(SpecError::ViewCount(self.extra_views.len()));
        }
        for (index, view) in self.extra_views.iter().enumerate() {
            let flip = match (0.0..=1.0).contains(&view.flip_prob) {
                true => Ok(()),
                false => Err(SpecError::FlipProb(view.flip_prob)),
            };
            check_crop(&view.crop)
                .and(flip)
                .and_then(|()| check_ops(&view.ops).map_err(SpecError::Op))
                .and_then(|()| match &view.erasing {
                    Some(e) => e.check().map_err(SpecError::Op),
                    None => Ok(()),
                })
                .map_err(|e| SpecError::View {
                    index,
                    reason: Box::new(e),
                })?;
        }
        check_ops(&self.ops)?;
        if let Some(erasing) = &self.erasing {
            erasing.check()?;
        }
        if let Some(mix) = &self.batch_mix {
            mix.check()?;
            if self.dtype == DType::U8 {
                return Err(SpecError::MixDType);
            }
            let bytes = u64::from(self.batch_size) * u64::from(mix.num_classes()) * 4;
            if bytes > MAX_SLOT_SOFT_LABEL_BYTES {
                return Err(SpecError::SoftLabelBytes(bytes));
            }
            let cuts = match mix {
                BatchMix::CutMix { .. } => true,
                BatchMix::Choice { mixes, .. } => {
                    mixes.iter().any(|m| matches!(m, BatchMix::CutMix { .. }))
                }
                BatchMix::MixUp { .. } => false,
            };
            let (h, w) = self.crop.output_size();
            let other = self
                .extra_views
                .iter()
                .enumerate()
                .find(|(_, v)| v.crop.output_size() != (h, w));
            if let (true, Some((i, v))) = (cuts, other) {
                let (vh, vw) = v.crop.output_size();
                return Err(SpecError::MixViewSizes(h, w, i + 1, vh, vw));
            }
        }
        for c in 0..3 {
            if !self.mean[c].is_finite() {
                return Err(SpecError::Mean(c, self.mean[c]));
            }
            if !self.std[c].is_finite() || self.std[c] == 0.0 {
                return Err(SpecError::Std(c, self.std[c]));
            }
        }
        if self.epochs == Some(0) {
            return Err(SpecError::Epochs);
        }
        self.validate_fields()
    }

    /// Checks `fields` and `field_max_bytes`: names are lowercase extensions, each once.
    fn validate_fields(&self) -> Result<(), SpecError> {
        if self.fields.len() > MAX_FIELDS {
            return Err(SpecError::FieldCount(self.fields.len()));
        }
        for (index, name) in self.fields.iter().enumerate() {
            let refuse = |reason| {
                Err(SpecError::Field {
                    index,
                    name: name.clone(),
                    reason,
                })
            };
            if name.is_empty() || name.len() > MAX_FIELD_NAME {
                return refuse("a field name is 1 to 64 characters");
            }
            let allowed =
                |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
            if !name.bytes().all(allowed) || name.starts_with('.') || name.ends_with('.') {
                return refuse("a field name is an extension: lowercase a-z, 0-9, '.', '_', '-', not starting or ending with '.'");
            }
            if self.fields[..index].contains(name) {
                return refuse("is asked for twice");
            }
        }
        if self.field_max_bytes == 0 || self.field_max_bytes > MAX_FIELD_BYTES {
            return Err(SpecError::FieldMaxBytes(self.field_max_bytes));
        }
        let slot =
            u64::from(self.batch_size) * self.fields.len() as u64 * u64::from(self.field_max_bytes);
        if slot > MAX_SLOT_FIELD_BYTES {
            return Err(SpecError::FieldSlotBytes(slot));
        }
        Ok(())
    }
}

/// Checks one crop: its output size, and its ranges or resize.
fn check_crop(crop: &Crop) -> Result<(), SpecError> {
    let (h, w) = crop.output_size();
    if h == 0 || w == 0 || h > MAX_OUTPUT_SIDE || w > MAX_OUTPUT_SIDE {
        return Err(SpecError::OutputSize(h, w));
    }
    match *crop {
        Crop::RandomResized { scale, ratio, .. } => {
            check_range("scale", scale)?;
            check_range("ratio", ratio)
        }
        Crop::CenterCrop { resize, size } => {
            let smaller = size[0].min(size[1]);
            if resize < smaller || resize > MAX_OUTPUT_SIDE {
                return Err(SpecError::Resize {
                    resize,
                    size: smaller,
                });
            }
            Ok(())
        }
    }
}

fn check_range(field: &'static str, r: [f32; 2]) -> Result<(), SpecError> {
    let [lo, hi] = r;
    if lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi {
        Ok(())
    } else {
        Err(SpecError::Range { field, lo, hi })
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::{BatchMix, Crop, PipelineSpec, View};

    /// A batch mix's own limits: its soft labels must fit a slot, and CutMix's one box needs
    /// views of one size; MixUp blends views of any sizes.
    #[test]
    fn a_batch_mix_is_refused_when_its_labels_or_box_cannot_be_served() {
        let cut = BatchMix::CutMix {
            alpha: 1.0,
            num_classes: 10,
        };
        let huge = PipelineSpec {
            batch_mix: Some(BatchMix::MixUp {
                alpha: 1.0,
                num_classes: 1 << 20,
            }),
            ..PipelineSpec::train(1024, 32)
        };
        let e = huge.validate().unwrap_err().to_string();
        assert!(e.contains("soft labels take 4294967296 bytes"), "{e}");
        let views = PipelineSpec {
            extra_views: vec![View::new(Crop::random_resized(16), 0.5)],
            batch_mix: Some(cut.clone()),
            ..PipelineSpec::train(8, 32)
        };
        let e = views.validate().unwrap_err().to_string();
        assert!(e.contains("view 0 is 32x32 and view 1 is 16x16"), "{e}");
        let choice = BatchMix::Choice {
            mixes: vec![cut],
            p: None,
        };
        let e = PipelineSpec {
            batch_mix: Some(choice),
            ..views.clone()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("CutMix needs every view"), "{e}");
        PipelineSpec {
            batch_mix: Some(BatchMix::MixUp {
                alpha: 0.2,
                num_classes: 10,
            }),
            ..views
        }
        .validate()
        .unwrap();
    }
}

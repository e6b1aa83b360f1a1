//! Where two runs' logits differ: the first position and the largest difference, NaN kept.

/// Where two runs' logits first differ (by position) and by how much at most.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diff {
    pub first_position: Option<usize>,
    pub max_abs: f32,
}

impl Diff {
    pub const NONE: Diff = Diff {
        first_position: None,
        max_abs: 0.0,
    };

    pub fn of(a: &[f32], b: &[f32], vocab: usize) -> Diff {
        let mut diff = Diff::NONE;
        if a.len() != b.len() {
            return Diff {
                first_position: Some(0),
                max_abs: f32::INFINITY,
            };
        }
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            if x.to_bits() != y.to_bits() {
                // A NaN stays NaN (reported as such), never dropped by `max`.
                let d = (x - y).abs();
                diff.max_abs = if d.is_nan() || diff.max_abs.is_nan() {
                    f32::NAN
                } else {
                    diff.max_abs.max(d)
                };
                let position = i / vocab;
                diff.first_position =
                    Some(diff.first_position.map_or(position, |p| p.min(position)));
            }
        }
        diff
    }

    pub fn merge(self, other: Diff) -> Diff {
        Diff {
            first_position: match (self.first_position, other.first_position) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            max_abs: if self.max_abs.is_nan() || other.max_abs.is_nan() {
                f32::NAN
            } else {
                self.max_abs.max(other.max_abs)
            },
        }
    }

    pub fn identical(&self) -> bool {
        self.first_position.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_keep_nan() {
        let d = Diff::of(&[0.0, 1.0], &[0.0, f32::NAN], 2);
        assert!(d.max_abs.is_nan() && d.first_position == Some(0));
        let merged = d.merge(Diff::of(&[2.0], &[1.0], 1));
        assert!(merged.max_abs.is_nan());
        assert!(Diff::of(&[2.0], &[1.0], 1).merge(d).max_abs.is_nan());
    }
}

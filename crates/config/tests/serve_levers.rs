//! ServeShape widths and the lever set.

use solder_config::{ConfigError, Levers, ServeShape, DEFAULT_MULTI_SEQ_LADDER, KNOWN_LEVERS};

#[test]
fn default_shape_uses_the_whole_ladder() {
    let shape = ServeShape::default();
    assert_eq!(shape.max_batch, 128);
    assert_eq!(shape.multi_seq_ladder, DEFAULT_MULTI_SEQ_LADDER.to_vec());
    assert_eq!(shape.verify_widths, vec![2, 3, 4, 5, 6, 7, 8]);
    assert!(shape.draft_widths.is_empty());
    shape.validate().expect("default is valid");
}

#[test]
fn ladder_is_cut_at_max_batch() {
    let shape = ServeShape::with_max_batch(48).expect("valid");
    assert_eq!(shape.multi_seq_ladder, vec![2, 4, 8, 12, 16, 24, 32, 48]);
    shape.validate().expect("valid");
    let single = ServeShape::with_max_batch(1).expect("valid");
    assert!(single.multi_seq_ladder.is_empty());
    assert!(ServeShape::with_max_batch(0).is_err());
}

#[test]
fn validate_rejects_unsorted_ladder() {
    let shape = ServeShape {
        multi_seq_ladder: vec![2, 8, 4],
        ..ServeShape::default()
    };
    let err = shape.validate().expect_err("unsorted");
    assert!(err.to_string().contains("multi_seq_ladder"), "{err}");
}

#[test]
fn validate_rejects_out_of_range_widths() {
    let too_wide = ServeShape {
        multi_seq_ladder: vec![2, 4, 256],
        ..ServeShape::default()
    };
    assert!(too_wide.validate().is_err());
    let one_row = ServeShape {
        multi_seq_ladder: vec![1, 2],
        ..ServeShape::default()
    };
    assert!(one_row.validate().is_err());
    let long_verify = ServeShape {
        verify_widths: vec![2, 513],
        ..ServeShape::default()
    };
    assert!(long_verify.validate().is_err());
    let zero_draft = ServeShape {
        draft_widths: vec![0],
        ..ServeShape::default()
    };
    let err = zero_draft.validate().expect_err("zero width");
    assert!(err.to_string().contains("draft_widths"), "{err}");
    let speculative = ServeShape {
        speculative_rows: solder_config::MAX_ROWS + 1,
        ..ServeShape::default()
    };
    let err = speculative.validate().expect_err("too many rows");
    assert!(err.to_string().contains("speculative_rows"), "{err}");
    let none = ServeShape {
        speculative_rows: 0,
        ..ServeShape::default()
    };
    none.validate()
        .expect("no speculative step is a valid serve");
}

#[test]
fn unknown_lever_is_refused() {
    let mut levers = Levers::default();
    let err = levers.set("turbo", true).expect_err("unknown lever");
    assert!(matches!(err, ConfigError::UnknownLever { .. }));
    let message = err.to_string();
    assert!(
        message.contains("turbo") && message.contains("fast_exp"),
        "{message}"
    );
    assert!(!Levers::is_known("turbo"));
    assert_eq!(levers, Levers::default());
}

#[test]
fn fast_exp_toggles() {
    assert!(KNOWN_LEVERS.iter().any(|(name, _)| *name == "fast_exp"));
    assert!(Levers::is_known("fast_exp"));
    let mut levers = Levers::default();
    assert!(!levers.is_on("fast_exp"));
    levers.set("fast_exp", true).expect("known lever");
    assert!(levers.is_on("fast_exp"));
    assert_eq!(levers.enabled().collect::<Vec<_>>(), vec!["fast_exp"]);
    levers.set("fast_exp", false).expect("known lever");
    assert!(!levers.is_on("fast_exp"));
    assert_eq!(levers.enabled().count(), 0);
}

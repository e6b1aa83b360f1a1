//! `Instance`: a circuit with the shape it is served at and its precision.

use solder_config::{ModelConfig, ServeShape};

use crate::error::CircuitError;
use crate::families::{build_circuit, model_name, CircuitOptions};
use crate::ir::{Circuit, Dtype};
use crate::mode::Mode;

/// Storage formats of a served model (DESIGN.md, "Numerics and parity").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precision {
    pub weights: Dtype,
    pub activations: Dtype,
    pub residual: Dtype,
    pub logits: Dtype,
}

impl Default for Precision {
    fn default() -> Self {
        Precision {
            weights: Dtype::Bf16,
            activations: Dtype::Bf16,
            residual: Dtype::F32,
            logits: Dtype::F32,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub circuit: Circuit,
    pub serve: ServeShape,
    pub precision: Precision,
}

impl Instance {
    pub fn new(circuit: Circuit, serve: ServeShape) -> Instance {
        Instance {
            circuit,
            serve,
            precision: Precision::default(),
        }
    }

    /// The family's circuit for `config`, served at `serve`.
    pub fn from_config(config: &ModelConfig, serve: ServeShape) -> Result<Instance, CircuitError> {
        Instance::from_config_with(config, serve, CircuitOptions::default())
    }

    /// As `from_config`, with circuit options (KV page size).
    pub fn from_config_with(
        config: &ModelConfig,
        serve: ServeShape,
        options: CircuitOptions,
    ) -> Result<Instance, CircuitError> {
        serve.validate().map_err(|e| CircuitError::Unsupported {
            source_name: config.source.clone(),
            message: e.to_string(),
        })?;
        let circuit = build_circuit(config, &model_name(&config.source), options)?;
        Ok(Instance::new(circuit, serve))
    }

    /// Every (mode, rows) the serve shape asks a program for: decode; multi_seq over the
    /// ladder; verify at each width. (`verify_batch` row tables and the draft head come with
    /// the families and sessions that use them.)
    pub fn shapes(&self) -> Vec<(Mode, usize)> {
        let mut shapes = vec![(Mode::Decode, 1)];
        shapes.extend(
            self.serve
                .multi_seq_ladder
                .iter()
                .map(|&w| (Mode::MultiSeq, w)),
        );
        shapes.extend(self.serve.verify_widths.iter().map(|&k| (Mode::Verify, k)));
        shapes
    }
}

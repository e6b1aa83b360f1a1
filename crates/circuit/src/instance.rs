//! `Instance`: a circuit with the programs it is served with (`ProgramShapes`) and its
//! precision. Invariant: an instance's serve shape passed `ProgramShapes::new`.

use solder_config::{ModelConfig, ServeShape};

use crate::error::CircuitError;
use crate::families::{build_circuit, model_name, CircuitOptions};
use crate::ir::{Circuit, Dtype};
use crate::mode::Mode;
use crate::shapes::ProgramShapes;

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

/// A circuit and the programs it is served with. The serve shape is checked when the instance
/// is made (`ProgramShapes::new`), so every instance's `shapes()` can be compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub circuit: Circuit,
    pub precision: Precision,
    serve: ServeShape,
    shapes: ProgramShapes,
}

impl Instance {
    /// `circuit` served at `serve`; refuses a serve shape `ProgramShapes::new` refuses.
    pub fn new(circuit: Circuit, serve: ServeShape) -> Result<Instance, CircuitError> {
        let shapes = ProgramShapes::new(&serve)?;
        Ok(Instance {
            circuit,
            precision: Precision::default(),
            serve,
            shapes,
        })
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
        // The serve shape first: a refused shape is named before any circuit is built.
        ProgramShapes::new(&serve).map_err(|e| CircuitError::Unsupported {
            source_name: config.source.clone(),
            message: e.to_string(),
        })?;
        let circuit = build_circuit(config, &model_name(&config.source), options)?;
        Instance::new(circuit, serve)
    }

    /// The serve shape the instance was made with.
    pub fn serve(&self) -> &ServeShape {
        &self.serve
    }

    /// The programs the serve shape asks for (`ProgramShapes`).
    pub fn program_shapes(&self) -> &ProgramShapes {
        &self.shapes
    }

    /// Every (mode, rows) the serve shape asks a program for, in canonical order: decode;
    /// multi_seq over the ladder; verify at each width. (`verify_batch` row tables and the
    /// draft head come with the families and sessions that use them.)
    pub fn shapes(&self) -> Vec<(Mode, usize)> {
        self.shapes.all().to_vec()
    }
}

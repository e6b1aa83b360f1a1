//! [`Instance`]: a circuit with the programs it is served with ([`ProgramShapes`]) and its
//! precision (each weight slot's format, chosen by a [`PrecisionSpec`]), and, when the serve asks for draft programs, the MTP draft head's circuit.
//! Invariants: an instance's serve shape passed [`ProgramShapes::new`](crate::ProgramShapes::new);
//! it has a draft circuit exactly when its shapes hold draft programs, and that circuit extends the
//! target's weights and states ([`families::build_draft`](crate::families::build_draft)), so
//! `storage()` lists every slot and state of both; it has prefill programs exactly when its
//! circuit has logits to drop, and their circuit (`prune::without_logits`, derived once) keeps
//! the model's weight slots and states.

use solder_config::{ModelConfig, ServeShape};

use crate::error::CircuitError;
use crate::families::{
    build_circuit, build_draft, build_target_with_hidden, model_name, CircuitOptions,
};
use crate::format::WeightFormat;
use crate::ir::{Circuit, Dtype};
use crate::mode::Mode;
use crate::precision::{self, PrecisionSpec};
use crate::rules::RuleSet;
use crate::shapes::ProgramShapes;

/// Storage formats of a served model (DESIGN.md, "Numerics and parity").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precision {
    /// The element type kernels compute with once a weight is dequantised.
    pub weights: Dtype,
    pub activations: Dtype,
    pub residual: Dtype,
    pub logits: Dtype,
    /// How the weight formats were chosen.
    pub spec: PrecisionSpec,
    /// The format the checkpoint stores each weight slot in, by `WeightId` of
    /// [`Instance::storage`]; each slot's served format is its `WeightSlot::format`. A slot
    /// served bf16 that the checkpoint stores quantized is dequantised at load. Empty for an
    /// instance of a hand-built circuit (its slots' formats are what the circuit says).
    pub checkpoint_formats: Vec<WeightFormat>,
}

impl Default for Precision {
    fn default() -> Self {
        Precision {
            weights: Dtype::Bf16,
            activations: Dtype::Bf16,
            residual: Dtype::F32,
            logits: Dtype::F32,
            spec: PrecisionSpec::default(),
            checkpoint_formats: Vec::new(),
        }
    }
}

/// A circuit and the programs it is served with. The serve shape is checked when the instance
/// is made (`ProgramShapes::new`), so every instance's `shapes()` can be compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub circuit: Circuit,
    /// The MTP draft head's step circuit (`Mode::Draft`), when draft programs are served.
    pub draft: Option<Circuit>,
    pub precision: Precision,
    /// `circuit` without its logits (`Mode::Prefill`), derived when the instance is made;
    /// `None` (and no prefill programs) when the circuit has no head to drop.
    prefill: Option<Circuit>,
    serve: ServeShape,
    shapes: ProgramShapes,
}

impl Instance {
    /// `circuit` served at `serve`; refuses a serve shape `ProgramShapes::new` refuses.
    pub fn new(circuit: Circuit, serve: ServeShape) -> Result<Instance, CircuitError> {
        Instance::with_draft(circuit, None, serve)
    }

    /// `circuit` and its draft head's circuit `draft`, served at `serve`; refuses draft
    /// programs without a draft circuit (and a draft circuit no draft program runs).
    pub fn with_draft(
        circuit: Circuit,
        draft: Option<Circuit>,
        serve: ServeShape,
    ) -> Result<Instance, CircuitError> {
        let shapes = ProgramShapes::new(&serve)?;
        if shapes.has_draft() != draft.is_some() {
            return Err(CircuitError::ServeShape {
                field: "draft_widths",
                problem: format!(
                    "is {:?} but the model {} a draft circuit: draft programs need the MTP \
                     draft head's circuit and only run it",
                    serve.draft_widths,
                    if draft.is_some() { "has" } else { "has no" }
                ),
            });
        }
        // Prefill programs run the circuit without its logits; none when it has no head.
        let prefill = crate::prune::without_logits(&circuit);
        let shapes = match prefill {
            Some(_) => shapes,
            None => shapes.without(Mode::Prefill),
        };
        Ok(Instance {
            circuit,
            draft,
            precision: Precision::default(),
            prefill,
            serve,
            shapes,
        })
    }

    /// The family's circuit for `config`, served at `serve`, each weight in the format the
    /// checkpoint stores it (`PrecisionSpec::default()`, from `config.quantization`; without
    /// rules to check against, a format no rule reads is refused by the fuser, naming it).
    pub fn from_config(config: &ModelConfig, serve: ServeShape) -> Result<Instance, CircuitError> {
        Instance::from_config_with(config, serve, CircuitOptions::default())
    }

    /// As `from_config`, with circuit options (KV page size).
    pub fn from_config_with(
        config: &ModelConfig,
        serve: ServeShape,
        options: CircuitOptions,
    ) -> Result<Instance, CircuitError> {
        Instance::build(config, serve, options, &PrecisionSpec::default(), None)
    }

    /// As `from_config_with`, each weight's format chosen by `spec` against the formats the
    /// `reference` rules of `rules` read (`precision::resolve`): under `Tier::Native` a
    /// quantized tensor no reference kernel reads is served bf16; a table entry that cannot
    /// hold is refused naming the tensor, the format and the kernels.
    pub fn from_config_precision(
        config: &ModelConfig,
        serve: ServeShape,
        options: CircuitOptions,
        spec: &PrecisionSpec,
        rules: &RuleSet,
    ) -> Result<Instance, CircuitError> {
        Instance::build(config, serve, options, spec, Some(rules))
    }

    fn build(
        config: &ModelConfig,
        serve: ServeShape,
        options: CircuitOptions,
        spec: &PrecisionSpec,
        rules: Option<&RuleSet>,
    ) -> Result<Instance, CircuitError> {
        let mut instance = Instance::unquantized(config, serve, options)?;
        let circuits: Vec<&Circuit> = std::iter::once(&instance.circuit)
            .chain(instance.draft.as_ref())
            .collect();
        let resolved = precision::resolve(
            spec,
            config.quantization.as_ref(),
            instance.storage(),
            &circuits,
            rules,
        )?;
        precision::apply(&resolved.served, &mut instance.circuit);
        // The prefill and draft circuits' slots are a prefix of, or all of, the storage's.
        for circuit in instance.draft.iter_mut().chain(instance.prefill.iter_mut()) {
            precision::apply(&resolved.served, circuit);
        }
        instance.precision.spec = spec.clone();
        instance.precision.checkpoint_formats = resolved.checkpoint;
        Ok(instance)
    }

    /// The family's circuits, every weight bf16.
    fn unquantized(
        config: &ModelConfig,
        serve: ServeShape,
        options: CircuitOptions,
    ) -> Result<Instance, CircuitError> {
        // The serve shape first: a refused shape is named before any circuit is built.
        ProgramShapes::new(&serve).map_err(|e| CircuitError::Unsupported {
            source_name: config.source.clone(),
            message: e.to_string(),
        })?;
        let name = model_name(&config.source);
        if serve.draft_widths.is_empty() {
            return Instance::new(build_circuit(config, &name, options)?, serve);
        }
        let circuit = build_target_with_hidden(config, &name, options)?;
        let draft = build_draft(config, &circuit, options)?;
        Instance::with_draft(circuit, Some(draft), serve)
    }

    /// The circuit `mode`'s programs run: the draft head's for `Mode::Draft`, the model's
    /// without its logits for `Mode::Prefill`, else the model's; refused for draft without a
    /// draft head and prefill without a head to drop.
    pub fn circuit_for(&self, mode: Mode) -> Result<&Circuit, CircuitError> {
        match (mode, &self.draft) {
            (Mode::Draft, Some(draft)) => Ok(draft),
            (Mode::Draft, None) => Err(CircuitError::Unsupported {
                source_name: self.circuit.name.clone(),
                message: "draft programs run the MTP draft head, and this instance has none \
                          (its serve shape asks for no `draft_widths`)"
                    .to_string(),
            }),
            (Mode::Prefill, _) => self
                .prefill
                .as_ref()
                .ok_or_else(|| CircuitError::Unsupported {
                    source_name: self.circuit.name.clone(),
                    message: "prefill programs run the circuit without its LM head, and this \
                          circuit has no `Logits` output to drop (or nothing but it)"
                        .to_string(),
                }),
            _ => Ok(&self.circuit),
        }
    }

    /// The circuit whose weight slots and state declarations cover every program's: the
    /// draft circuit (which extends the model's) when there is one, else the model's.
    pub fn storage(&self) -> &Circuit {
        self.draft.as_ref().unwrap_or(&self.circuit)
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
    /// multi_seq over the ladder; verify at each width; prefill at each verify width (when
    /// the circuit has a head to drop); draft at 1 row and each draft width.
    /// (`verify_batch` row tables come with the sessions that use them.)
    pub fn shapes(&self) -> Vec<(Mode, usize)> {
        self.shapes.all().to_vec()
    }
}

//! The one declaration of a kernel: `kernel!` turns a typed argument struct (named buffers
//! with their access and element type, scalars, optional buffers) and its grid function into
//! everything else a kernel needs — the launch argument list, the CPU twin's typed view (no
//! index reads), the registry entries (`KernelDecl`: name, parameters, twin, emitter), and the
//! parameter list a test checks against the CUDA signature.
//!
//! Invariant: a kernel's argument order is written once, in its struct; the launch, the twin's
//! view and the signature check all follow it.

use std::marker::PhantomData;

use solder_gpu_runtime::{Access, GpuError, KernelArg, LaunchConfig, TwinCtx, TwinFn};

use super::emit_view::View;
pub use super::launch::{Buf, Launch};
use crate::error::ExecError;

/// A kernel's `module::func` name, typed by the argument struct it launches with: a launch
/// can only carry a name its struct declares.
pub struct Name<K> {
    name: &'static str,
    kind: PhantomData<fn() -> K>,
}

impl<K> Name<K> {
    pub const fn new(name: &'static str) -> Name<K> {
        Name {
            name,
            kind: PhantomData,
        }
    }

    pub const fn as_str(&self) -> &'static str {
        self.name
    }
}

impl<K> Clone for Name<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Name<K> {}

impl<K> std::fmt::Debug for Name<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// How one launch of a kernel runs, as its declaration answers it from the launch's arguments
/// and the build's levers: the entry (the kernel or a variant of it), the launch
/// configuration, how many ways it splits its work, and the split scratch it needs. The
/// emitter launches exactly this; the layout sizes the scratch for the most any shape asks.
pub struct Shape<K> {
    pub entry: Name<K>,
    pub config: LaunchConfig,
    /// Ways the launch splits its work (gemv: grid.z ranges of k, `qkv_rope_kv`: blocks per
    /// head); 1 when unsplit.
    pub splits: u32,
    /// Bytes of its stream's gemv split-K scratch slot the launch uses; 0 when unsplit.
    pub scratch_bytes: usize,
}

impl<K> Shape<K> {
    /// `entry` launched in `config`, unsplit.
    pub fn plain(entry: Name<K>, config: LaunchConfig) -> Shape<K> {
        Shape {
            entry,
            config,
            splits: 1,
            scratch_bytes: 0,
        }
    }
}

impl<K> Clone for Shape<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Shape<K> {}

impl<K> std::fmt::Debug for Shape<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shape")
            .field("entry", &self.entry)
            .field("config", &self.config)
            .field("splits", &self.splits)
            .field("scratch_bytes", &self.scratch_bytes)
            .finish()
    }
}

/// What one kernel parameter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A device buffer of `elem` (`bf16`, `f32`, `i32`, `u32`); `optional` ones may be null.
    Buffer {
        elem: &'static str,
        access: Access,
        optional: bool,
    },
    U32,
    I32,
    F32,
}

/// One kernel parameter, in argument order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ParamKind,
}

/// Refuses a launch whose argument count is not the declaration's.
pub(crate) fn check_arity(ctx: &TwinCtx<'_>, params: &[Param]) -> Result<(), GpuError> {
    if ctx.arg_count() == params.len() {
        Ok(())
    } else {
        Err(ctx.fail(format!(
            "launched with {} arguments, the declaration has {}",
            ctx.arg_count(),
            params.len()
        )))
    }
}

/// The emitter of a kernel: a plan group → its launches.
pub type EmitFn = fn(&View<'_>) -> Result<Vec<Launch>, ExecError>;

/// A registry entry: everything the rest of solder knows of one kernel.
#[derive(Clone, Copy)]
pub struct KernelDecl {
    /// `module::func`.
    pub name: &'static str,
    pub params: &'static [Param],
    pub twin: TwinFn,
    pub emit: EmitFn,
}

impl KernelDecl {
    /// The module part of the name (`norm` of `norm::rms_norm`).
    pub fn module(&self) -> &'static str {
        self.name.split_once("::").map_or(self.name, |(m, _)| m)
    }

    /// The function part of the name (`rms_norm` of `norm::rms_norm`).
    pub fn func(&self) -> &'static str {
        self.name.split_once("::").map_or(self.name, |(_, f)| f)
    }
}

impl std::fmt::Debug for KernelDecl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDecl")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

pub(crate) fn read(b: Buf) -> KernelArg {
    KernelArg::read(b.ptr, b.bytes)
}

pub(crate) fn write(b: Buf) -> KernelArg {
    KernelArg::write(b.ptr, b.bytes)
}

pub(crate) fn read_write(b: Buf) -> KernelArg {
    KernelArg::read_write(b.ptr, b.bytes)
}

pub(crate) fn read_opt(b: Option<Buf>) -> KernelArg {
    b.map_or(KernelArg::Null, read)
}

pub(crate) fn write_opt(b: Option<Buf>) -> KernelArg {
    b.map_or(KernelArg::Null, write)
}

pub(crate) fn read_write_opt(b: Option<Buf>) -> KernelArg {
    b.map_or(KernelArg::Null, read_write)
}

pub(crate) const fn buffer(elem: &'static str, access: Access, optional: bool) -> ParamKind {
    ParamKind::Buffer {
        elem,
        access,
        optional,
    }
}

/// Declares a kernel. Fields are `name: In<T>` (read), `InOpt<T>` (read, may be null),
/// `Out<T>` (written), `OutOpt<T>`, `InOut<T>` (read and written), `InOutOpt<T>`, `U32`, `I32`,
/// `F32`;
/// `grid(a) = expr` computes the launch configuration of the kernel's own entry from the struct
/// `a`; an optional `, shape(levers) = expr` after it declares the whole `Shape` an emitter
/// launches (entry, grid, splits and scratch) from the struct and the build's levers, where
/// that is more than the kernel's own entry unsplit (gemv's streaming entries and splits);
/// each
/// `CONST = "module::func" => twin f, emit g;` line declares one kernel taking these
/// arguments (several kernels may share one struct), its CPU twin (`fn(View) -> Result`) and
/// its emitter.
macro_rules! kernel {
    (
        $(#[$meta:meta])*
        pub struct $name:ident / $view:ident {
            $( $(#[$fmeta:meta])* $field:ident : $kind:ident $(<$elem:ty>)? ),+ $(,)?
        }
        grid($a:ident) = $grid:expr $(, shape($levers:ident) = $shape:expr)?;
        $( $cname:ident = $kname:literal => twin $twin:path, emit $emit:path; )+
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $crate::kernels::decl::field_ty!($kind $($elem)?), )+
        }

        /// The CPU twin's typed view of the launch's arguments, checked against the
        /// declaration when it is read.
        #[allow(dead_code)]
        pub struct $view<'c> {
            pub ctx: &'c solder_gpu_runtime::TwinCtx<'c>,
            $( pub $field: $crate::kernels::decl::view_ty!('c; $kind $($elem)?), )+
        }

        impl<'c> $view<'c> {
            /// Reads every argument by its declared kind, in declaration order.
            pub fn read(
                ctx: &'c solder_gpu_runtime::TwinCtx<'c>,
            ) -> Result<$view<'c>, solder_gpu_runtime::GpuError> {
                $crate::kernels::decl::check_arity(ctx, $name::PARAMS)?;
                let mut index = 0usize;
                $(
                    let $field = $crate::kernels::decl::read_arg!(
                        ctx, index, stringify!($field); $kind $($elem)?
                    );
                    index += 1;
                )+
                let _ = index;
                Ok($view { ctx, $($field),+ })
            }
        }

        impl $name {
            /// The parameters, in argument order (the CUDA signature's order).
            pub const PARAMS: &'static [$crate::kernels::decl::Param] = &[
                $( $crate::kernels::decl::Param {
                    name: stringify!($field),
                    kind: $crate::kernels::decl::param_kind!($kind $($elem)?),
                }, )+
            ];

            /// Every kernel that takes these arguments.
            pub const DECLS: &'static [$crate::kernels::decl::KernelDecl] = &[
                $( $crate::kernels::decl::KernelDecl {
                    name: $kname,
                    params: $name::PARAMS,
                    twin: |ctx| $twin($view::read(ctx)?),
                    emit: $emit,
                }, )+
            ];

            /// The launch configuration of these arguments as the kernel's own entry, unsplit.
            pub fn config(&self) -> solder_gpu_runtime::LaunchConfig {
                let $a = self;
                $grid
            }

            /// The launch of `kernel` with these arguments in `config` (its own entry, unsplit:
            /// what twin tests launch; emitters launch `shape`).
            pub fn launch(self, kernel: $crate::kernels::decl::Name<$name>) -> $crate::kernels::Launch {
                $crate::kernels::Launch {
                    kernel: kernel.as_str(),
                    config: self.config(),
                    args: self.args(),
                }
            }

            /// The launch of `kernel` with these arguments in `config`: a shape chosen by the
            /// caller (tests of a variant entry or a split; emitters launch `shape`).
            #[allow(dead_code)]
            pub fn launch_with(
                self,
                kernel: $crate::kernels::decl::Name<$name>,
                config: solder_gpu_runtime::LaunchConfig,
            ) -> $crate::kernels::Launch {
                $crate::kernels::Launch {
                    kernel: kernel.as_str(),
                    config,
                    args: self.args(),
                }
            }

            $crate::kernels::decl::launch_shape!($name; $( $a, $levers, $shape )?);

            pub fn args(&self) -> Vec<solder_gpu_runtime::KernelArg> {
                vec![ $( $crate::kernels::decl::to_arg!(self.$field; $kind) ),+ ]
            }

            /// The launch of these arguments in `shape` (its entry and configuration).
            #[allow(dead_code)]
            pub fn launch_in(
                self,
                shape: $crate::kernels::decl::Shape<$name>,
            ) -> $crate::kernels::Launch {
                $crate::kernels::Launch {
                    kernel: shape.entry.as_str(),
                    config: shape.config,
                    args: self.args(),
                }
            }
        }

        $( pub const $cname: $crate::kernels::decl::Name<$name> =
            $crate::kernels::decl::Name::new($kname); )+
    };
}

/// A `kernel!` struct's `shape`: declared with `grid(a) = …, shape(levers) = expr`, else the kernel's own
/// entry in `config`, unsplit.
macro_rules! launch_shape {
    ($name:ident;) => {
        /// The launch shape of `kernel` with these arguments: itself, in `config`, unsplit.
        #[allow(dead_code)]
        pub fn shape(
            &self,
            kernel: $crate::kernels::decl::Name<$name>,
            _levers: &solder_config::Levers,
        ) -> $crate::kernels::decl::Shape<$name> {
            $crate::kernels::decl::Shape::plain(kernel, self.config())
        }
    };
    ($name:ident; $a:ident, $levers:ident, $shape:expr) => {
        /// The launch shape of these arguments under `levers`: entry, grid, splits, scratch.
        pub fn shape(
            &self,
            $levers: &solder_config::Levers,
        ) -> $crate::kernels::decl::Shape<$name> {
            let $a = self;
            $shape
        }
    };
}

macro_rules! field_ty {
    (In $e:ty) => { $crate::kernels::Buf };
    (InOpt $e:ty) => { Option<$crate::kernels::Buf> };
    (Out $e:ty) => { $crate::kernels::Buf };
    (OutOpt $e:ty) => { Option<$crate::kernels::Buf> };
    (InOut $e:ty) => { $crate::kernels::Buf };
    (InOutOpt $e:ty) => { Option<$crate::kernels::Buf> };
    (U32) => { u32 };
    (I32) => { i32 };
    (F32) => { f32 };
}

macro_rules! view_ty {
    ($l:lifetime; In $e:ty) => { $crate::kernels::args::In<$l, $e> };
    ($l:lifetime; InOpt $e:ty) => { $crate::kernels::args::InOpt<$l, $e> };
    ($l:lifetime; Out $e:ty) => { $crate::kernels::args::Out<$l, $e> };
    ($l:lifetime; OutOpt $e:ty) => { $crate::kernels::args::OutOpt<$l, $e> };
    ($l:lifetime; InOut $e:ty) => { $crate::kernels::args::Out<$l, $e> };
    ($l:lifetime; InOutOpt $e:ty) => { $crate::kernels::args::OutOpt<$l, $e> };
    ($l:lifetime; U32) => { $crate::kernels::args::Dim<$l> };
    ($l:lifetime; I32) => { i32 };
    ($l:lifetime; F32) => { f32 };
}

macro_rules! read_arg {
    ($ctx:ident, $i:ident, $n:expr; In $e:ty) => {
        $crate::kernels::args::In::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; InOpt $e:ty) => {
        $crate::kernels::args::InOpt::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; Out $e:ty) => {
        $crate::kernels::args::Out::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; OutOpt $e:ty) => {
        $crate::kernels::args::OutOpt::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; InOut $e:ty) => {
        $crate::kernels::args::Out::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; InOutOpt $e:ty) => {
        $crate::kernels::args::OutOpt::<$e>::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; U32) => {
        $crate::kernels::args::Dim::read($ctx, $i, $n)?
    };
    ($ctx:ident, $i:ident, $n:expr; I32) => {
        $ctx.i32($i)?
    };
    ($ctx:ident, $i:ident, $n:expr; F32) => {
        $ctx.f32($i)?
    };
}

macro_rules! param_kind {
    (In $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::Read,
            false,
        )
    };
    (InOpt $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::Read,
            true,
        )
    };
    (Out $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::Write,
            false,
        )
    };
    (OutOpt $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::Write,
            true,
        )
    };
    (InOut $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::ReadWrite,
            false,
        )
    };
    (InOutOpt $e:ty) => {
        $crate::kernels::decl::buffer(
            <$e as solder_gpu_runtime::Element>::NAME,
            solder_gpu_runtime::Access::ReadWrite,
            true,
        )
    };
    (U32) => {
        $crate::kernels::decl::ParamKind::U32
    };
    (I32) => {
        $crate::kernels::decl::ParamKind::I32
    };
    (F32) => {
        $crate::kernels::decl::ParamKind::F32
    };
}

macro_rules! to_arg {
    ($v:expr; In) => {
        $crate::kernels::decl::read($v)
    };
    ($v:expr; InOpt) => {
        $crate::kernels::decl::read_opt($v)
    };
    ($v:expr; Out) => {
        $crate::kernels::decl::write($v)
    };
    ($v:expr; OutOpt) => {
        $crate::kernels::decl::write_opt($v)
    };
    ($v:expr; InOut) => {
        $crate::kernels::decl::read_write($v)
    };
    ($v:expr; InOutOpt) => {
        $crate::kernels::decl::read_write_opt($v)
    };
    ($v:expr; U32) => {
        solder_gpu_runtime::KernelArg::U32($v)
    };
    ($v:expr; I32) => {
        solder_gpu_runtime::KernelArg::I32($v)
    };
    ($v:expr; F32) => {
        solder_gpu_runtime::KernelArg::F32($v)
    };
}

pub(crate) use {field_ty, kernel, launch_shape, param_kind, read_arg, to_arg, view_ty};

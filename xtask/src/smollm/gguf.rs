//! A GGUF (v2/v3) reader: the header, every metadata value (arrays included) and the tensor
//! infos, over a file read into memory; each tensor's bytes located and its elements
//! dequantised to f32 (F32, F16, Q8_0 and Q4_1, the types llama.cpp's Q4_1 files hold).
//!
//! The layout (ggml's `gguf.h`): magic `GGUF`, u32 version, u64 tensor count, u64 KV count;
//! each KV a string key, a u32 type and the value; each tensor info a string name, u32 dims,
//! u64 extents (innermost first), u32 ggml type, u64 offset into the data, which starts at the
//! first multiple of `general.alignment` (32 by default) after the infos. Strings are a u64
//! length and UTF-8 bytes, little-endian throughout.

use std::collections::BTreeMap;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Uint(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Uint(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor types read here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_1,
    Q8_0,
}

impl GgmlType {
    fn of(code: u32) -> Option<GgmlType> {
        match code {
            0 => Some(GgmlType::F32),
            1 => Some(GgmlType::F16),
            3 => Some(GgmlType::Q4_1),
            8 => Some(GgmlType::Q8_0),
            _ => None,
        }
    }

    /// (elements per block, bytes per block).
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
        }
    }
}

/// One tensor: its name, extents in Hugging Face order (outermost first), type and where its
/// bytes start in the data section.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub ty: GgmlType,
    offset: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A parsed GGUF file.
pub struct Gguf {
    bytes: Vec<u8>,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data: usize,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| format!("truncated at byte {} (wanted {n} more)", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len())
            .ok_or_else(|| format!("length {n} at byte {} past the file", self.at))
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.len()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|e| format!("a string: {e}"))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::Uint(self.array::<1>()?[0] as u64),
            1 => Value::Int(self.array::<1>()?[0] as i8 as i64),
            2 => Value::Uint(u16::from_le_bytes(self.array()?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.array()?) as i64),
            4 => Value::Uint(self.u32()? as u64),
            5 => Value::Int(i32::from_le_bytes(self.array()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.array()?) as f64),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth == 0 => {
                let inner = self.u32()?;
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.array()?)),
            12 => Value::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("metadata type {other} is not GGUF's")),
        })
    }
}

impl Gguf {
    /// Parses `bytes` (a whole GGUF file).
    pub fn parse(bytes: Vec<u8>) -> Result<Gguf, String> {
        let mut c = Cursor {
            bytes: &bytes,
            at: 0,
        };
        if c.take(4)? != b"GGUF" {
            return Err("not a GGUF file (no `GGUF` magic)".into());
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!("GGUF version {version}; versions 2 and 3 are read"));
        }
        let tensor_count = c.len()?;
        let kv_count = c.len()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = c.string()?;
            let ty = c.u32()?;
            let value = c
                .value(ty, 0)
                .map_err(|e| format!("metadata `{key}`: {e}"))?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            let name = c.string()?;
            let dims = c.u32()? as usize;
            if dims > 4 {
                return Err(format!("tensor `{name}`: {dims} dimensions"));
            }
            let mut shape = Vec::with_capacity(dims);
            for _ in 0..dims {
                shape.push(c.len()?);
            }
            shape.reverse();
            let code = c.u32()?;
            let ty = GgmlType::of(code)
                .ok_or_else(|| format!("tensor `{name}`: ggml type {code} is not read here"))?;
            let offset = c.len()?;
            tensors.push(TensorInfo {
                name,
                shape,
                ty,
                offset,
            });
        }
        let align = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32) as usize;
        if align == 0 || !align.is_power_of_two() {
            return Err(format!("general.alignment {align} is not a power of two"));
        }
        let data = c.at.next_multiple_of(align);
        let gguf = Gguf {
            bytes,
            metadata,
            tensors,
            data,
        };
        for t in &gguf.tensors {
            gguf.raw(t)?;
        }
        Ok(gguf)
    }

    /// A metadata value, refused by key when absent.
    pub fn get(&self, key: &str) -> Result<&Value, String> {
        self.metadata
            .get(key)
            .ok_or_else(|| format!("metadata `{key}` is missing"))
    }

    pub fn u64(&self, key: &str) -> Result<u64, String> {
        self.get(key)?
            .as_u64()
            .ok_or_else(|| format!("metadata `{key}` is not an integer"))
    }

    pub fn f64(&self, key: &str) -> Result<f64, String> {
        self.get(key)?
            .as_f64()
            .ok_or_else(|| format!("metadata `{key}` is not a number"))
    }

    pub fn str(&self, key: &str) -> Result<&str, String> {
        self.get(key)?
            .as_str()
            .ok_or_else(|| format!("metadata `{key}` is not a string"))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn raw(&self, t: &TensorInfo) -> Result<&[u8], String> {
        let (per, bytes) = t.ty.block();
        let n = t.elements();
        if !n.is_multiple_of(per) {
            return Err(format!(
                "tensor `{}`: {n} elements are not whole {per}-element blocks",
                t.name
            ));
        }
        let start = self.data + t.offset;
        let len = n / per * bytes;
        self.bytes
            .get(start..start + len)
            .ok_or_else(|| format!("tensor `{}`: its bytes run past the file", t.name))
    }

    /// The tensor's elements as f32, row-major in its (Hugging Face order) shape.
    pub fn dequantise(&self, t: &TensorInfo) -> Result<Vec<f32>, String> {
        let raw = self.raw(t)?;
        Ok(match t.ty {
            GgmlType::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4")))
                .collect(),
            GgmlType::F16 => raw.chunks_exact(2).map(f16_at).collect(),
            GgmlType::Q4_1 => raw.chunks_exact(20).flat_map(q4_1_block).collect(),
            GgmlType::Q8_0 => raw.chunks_exact(34).flat_map(q8_0_block).collect(),
        })
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Q4_1: f16 scale d, f16 minimum m, 16 bytes of nibbles; element j < 16 is the low nibble of
/// byte j, element 16 + j its high nibble; w = d·q + m, in f32 (as ggml and gguf-py compute).
pub fn q4_1_block(block: &[u8]) -> [f32; 32] {
    let (d, m) = (f16_at(&block[0..2]), f16_at(&block[2..4]));
    let mut out = [0.0; 32];
    for (j, &byte) in block[4..20].iter().enumerate() {
        out[j] = d * (byte & 0x0f) as f32 + m;
        out[j + 16] = d * (byte >> 4) as f32 + m;
    }
    out
}

/// Q8_0: f16 scale d, 32 signed bytes; w = d·q.
pub fn q8_0_block(block: &[u8]) -> [f32; 32] {
    let d = f16_at(&block[0..2]);
    let mut out = [0.0; 32];
    for (j, &q) in block[2..34].iter().enumerate() {
        out[j] = d * (q as i8) as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A two-tensor file: one Q4_1 row of 32, one F32 vector of 2, with metadata.
    fn file() -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        string(&mut out, "general.architecture");
        out.extend(8u32.to_le_bytes());
        string(&mut out, "llama");
        string(&mut out, "tokenizer.ggml.tokens");
        out.extend(9u32.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        string(&mut out, "a");
        string(&mut out, "é");
        string(&mut out, "w");
        out.extend(2u32.to_le_bytes());
        out.extend(32u64.to_le_bytes());
        out.extend(1u64.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        string(&mut out, "n");
        out.extend(1u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(32u64.to_le_bytes());
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        // d = 0.5, m = -1: nibbles 0..15 low, 15..0 high.
        out.extend(half::f16::from_f32(0.5).to_le_bytes());
        out.extend(half::f16::from_f32(-1.0).to_le_bytes());
        out.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        out.extend([0u8; 12]);
        out.extend(1.5f32.to_le_bytes());
        out.extend((-2.0f32).to_le_bytes());
        out
    }

    #[test]
    fn reads_metadata_tensors_and_q4_1() {
        let g = Gguf::parse(file()).expect("parse");
        assert_eq!(g.str("general.architecture").unwrap(), "llama");
        let tokens = g.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
        assert_eq!(tokens[1], Value::Str("é".into()));
        let w = g.tensor("w").unwrap();
        assert_eq!(w.shape, vec![1, 32]);
        let values = g.dequantise(w).unwrap();
        assert_eq!(values[0], -1.0);
        assert_eq!(values[15], 0.5 * 15.0 - 1.0);
        assert_eq!(values[16], 0.5 * 15.0 - 1.0);
        assert_eq!(values[31], -1.0);
        assert_eq!(
            g.dequantise(g.tensor("n").unwrap()).unwrap(),
            vec![1.5, -2.0]
        );
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let mut bytes = file();
        bytes.truncate(bytes.len() - 4);
        assert!(Gguf::parse(bytes).err().unwrap().contains("`n`"));
        assert!(Gguf::parse(b"GGML....".to_vec())
            .err()
            .unwrap()
            .contains("magic"));
    }
}

//! The tables "compiled" once per (API, version) into a flat list of operations: fields absent at
//! that version are dropped, classic or compact encodings are chosen, consecutive fixed-size
//! fields are merged into one skip, and every array carries its element's minimal size and memory
//! cost. Scanning a body is then a tight loop over that list ([`super::scanner`]), which is what
//! keeps the guard's cost small next to kafka-protocol's own decoding (see BENCHMARKS.md).

use std::sync::OnceLock;

use kafka_protocol::messages::ApiKey;

use super::tables::{message_index, MessageSchema, StructSchema, TaggedField, Ty, MESSAGES};
use Ty::*;

/// One step of a compiled scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Fixed-size fields: skip this many bytes.
    Skip(u32),
    /// `n` consecutive `STRING` or `BYTES` fields (at most 8): bit `j` of `wide` set means the
    /// `j`-th has an i32 length (`BYTES`), clear an i16 length (`STRING`); -1 is null.
    Classic { n: u8, wide: u8 },
    /// `n` consecutive `COMPACT_STRING` or `COMPACT_BYTES` fields: unsigned varint length + 1,
    /// 0 for null.
    Compacts(u32),
    /// Array of int32.
    Int32s { compact: bool },
    /// Array of structs; the element's operations are the next `len` ones.
    Array {
        compact: bool,
        /// Minimal encoded size of one element (at least 1).
        min: u32,
        /// `size_of` one decoded element.
        mem: u32,
        len: u32,
    },
    /// A tagged-field section; `known` indexes [`Program::tag_sets`], `NO_KNOWN_TAGS` for none.
    Tags { known: u32 },
}

pub(super) const NO_KNOWN_TAGS: u32 = u32::MAX;

/// Struct and field an operation reads, for error messages.
pub(super) type Label = (&'static str, &'static str);

pub(super) struct KnownTag {
    pub(super) tag: u32,
    pub(super) name: &'static str,
    pub(super) ops: Vec<Op>,
    pub(super) labels: Vec<Label>,
}

#[derive(Default)]
pub(super) struct Program {
    pub(super) ops: Vec<Op>,
    pub(super) labels: Vec<Label>,
    pub(super) tag_sets: Vec<Vec<KnownTag>>,
    /// Whether any operation, known tagged fields included, reads an array.
    pub(super) needs_scan: bool,
    /// For messages made of fixed-size fields only (Heartbeat): their size, and whether a tagged
    /// section follows. Such a body is accepted with one length check when its tagged section
    /// is empty; anything else takes the full scan, which reports what is wrong.
    pub(super) fixed: Option<(usize, bool)>,
}

pub(super) fn min_size(ty: Ty, version: i16, flexible: bool) -> usize {
    match ty {
        Bool | Int8 => 1,
        Int16 => 2,
        Int32 => 4,
        Int64 => 8,
        Uuid => 16,
        Str if !flexible => 2,
        Blob | Int32Array | StrArray | Array(_) if !flexible => 4,
        Str | Blob | Int32Array | StrArray | Array(_) => 1,
        Struct(s) => min_struct_size(s, version, flexible),
    }
}

pub(super) fn min_struct_size(s: &StructSchema, version: i16, flexible: bool) -> usize {
    let fields: usize = s
        .fields
        .iter()
        .filter(|f| f.present(version))
        .map(|f| min_size(f.ty, version, flexible))
        .sum();
    fields + usize::from(flexible)
}

struct Compiler<'p> {
    version: i16,
    flexible: bool,
    tag_sets: &'p mut Vec<Vec<KnownTag>>,
}

impl Compiler<'_> {
    fn structure(&mut self, s: &'static StructSchema, ops: &mut Vec<Op>, labels: &mut Vec<Label>) {
        // Index of a skip this struct emitted last, which the next fixed-size field may extend.
        let mut open_skip: Option<usize> = None;
        // Likewise for a run of string and byte fields, with the names of the fields in it.
        let mut open_run: Option<(usize, Vec<&'static str>)> = None;
        let version = self.version;
        for field in s.fields.iter().filter(|f| f.present(version)) {
            let label = (s.name, field.name);
            if matches!(field.ty, Str | Blob) {
                open_skip = None;
                let wide = matches!(field.ty, Blob);
                let last_index = ops.len().wrapping_sub(1);
                let extended = match (&mut open_run, ops.last_mut()) {
                    (Some((at, names)), Some(last)) if *at == last_index => match last {
                        Op::Compacts(n) => {
                            *n += 1;
                            names.push(field.name);
                            true
                        }
                        Op::Classic { n, wide: w } if *n < 8 => {
                            *w |= u8::from(wide) << *n;
                            *n += 1;
                            names.push(field.name);
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !extended {
                    close_run(&mut open_run, labels);
                    open_run = Some((ops.len(), vec![field.name]));
                    self.ty(field.ty, label, ops, labels);
                }
                continue;
            }
            close_run(&mut open_run, labels);
            match field.ty {
                Bool | Int8 | Int16 | Int32 | Int64 | Uuid => {
                    let n = min_size(field.ty, version, self.flexible) as u32;
                    match open_skip {
                        Some(i) => {
                            if let Op::Skip(m) = &mut ops[i] {
                                *m += n;
                            }
                        }
                        None => {
                            open_skip = Some(ops.len());
                            ops.push(Op::Skip(n));
                            labels.push(label);
                        }
                    }
                }
                ty => {
                    open_skip = None;
                    self.ty(ty, label, ops, labels);
                }
            }
        }
        close_run(&mut open_run, labels);
        if self.flexible {
            let known = self.known_tags(s.tagged);
            ops.push(Op::Tags { known });
            labels.push((s.name, "_tagged_fields"));
        }
    }

    fn ty(&mut self, ty: Ty, label: Label, ops: &mut Vec<Op>, labels: &mut Vec<Label>) {
        let op = match ty {
            Bool | Int8 | Int16 | Int32 | Int64 | Uuid => {
                Op::Skip(min_size(ty, self.version, self.flexible) as u32)
            }
            Str | Blob if self.flexible => Op::Compacts(1),
            Str => Op::Classic { n: 1, wide: 0 },
            Blob => Op::Classic { n: 1, wide: 1 },
            Int32Array => Op::Int32s {
                compact: self.flexible,
            },
            StrArray => {
                ops.push(Op::Array {
                    compact: self.flexible,
                    min: min_size(Str, self.version, self.flexible) as u32,
                    mem: std::mem::size_of::<kafka_protocol::protocol::StrBytes>() as u32,
                    len: 1,
                });
                labels.push(label);
                ops.push(if self.flexible {
                    Op::Compacts(1)
                } else {
                    Op::Classic { n: 1, wide: 0 }
                });
                labels.push(label);
                return;
            }
            Array(elem) => {
                let at = ops.len();
                ops.push(Op::Skip(0));
                labels.push(label);
                self.structure(elem, ops, labels);
                ops[at] = Op::Array {
                    compact: self.flexible,
                    min: min_struct_size(elem, self.version, self.flexible).max(1) as u32,
                    mem: elem.mem as u32,
                    len: (ops.len() - at - 1) as u32,
                };
                return;
            }
            // Inline: the parent's allocation holds it, so it costs no memory of its own.
            Struct(s) => {
                self.structure(s, ops, labels);
                return;
            }
        };
        ops.push(op);
        labels.push(label);
    }

    fn known_tags(&mut self, tagged: &'static [TaggedField]) -> u32 {
        let version = self.version;
        let mut set = Vec::new();
        for t in tagged.iter().filter(|t| t.present(version)) {
            let (mut ops, mut labels) = (Vec::new(), Vec::new());
            self.ty(t.ty, ("", t.name), &mut ops, &mut labels);
            set.push(KnownTag {
                tag: t.tag,
                name: t.name,
                ops,
                labels,
            });
        }
        if set.is_empty() {
            return NO_KNOWN_TAGS;
        }
        self.tag_sets.push(set);
        (self.tag_sets.len() - 1) as u32
    }
}

/// Ends a run of string fields: a run of several gets a label naming them all. The names are
/// leaked on purpose: programs are built once per process and live as long as it does.
fn close_run(open_run: &mut Option<(usize, Vec<&'static str>)>, labels: &mut [Label]) {
    if let Some((at, names)) = open_run.take() {
        if names.len() > 1 {
            if let Some(label) = labels.get_mut(at) {
                label.1 = Box::leak(names.join(" or ").into_boxed_str());
            }
        }
    }
}

fn compile(m: &'static MessageSchema, version: i16) -> Program {
    let mut program = Program::default();
    let (mut ops, mut labels) = (Vec::new(), Vec::new());
    let mut c = Compiler {
        version,
        flexible: version >= m.flexible,
        tag_sets: &mut program.tag_sets,
    };
    c.structure(m.root, &mut ops, &mut labels);
    program.fixed = match ops[..] {
        [Op::Skip(n)] => Some((n as usize, false)),
        [Op::Skip(n), Op::Tags {
            known: NO_KNOWN_TAGS,
        }] => Some((n as usize, true)),
        [Op::Tags {
            known: NO_KNOWN_TAGS,
        }] => Some((0, true)),
        _ => None,
    };
    let is_array = |op: &Op| matches!(op, Op::Array { .. } | Op::Int32s { .. });
    program.needs_scan = ops.iter().any(is_array)
        || program
            .tag_sets
            .iter()
            .flatten()
            .any(|k| k.ops.iter().any(is_array));
    program.ops = ops;
    program.labels = labels;
    program
}

/// Compiled programs, per entry of [`MESSAGES`], per version from its `min`.
pub(super) fn programs() -> &'static [Vec<Program>] {
    static PROGRAMS: OnceLock<Vec<Vec<Program>>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        MESSAGES
            .iter()
            .map(|m| (m.min..=m.max).map(|v| compile(m, v)).collect())
            .collect()
    })
}

#[inline]
pub(super) fn program(api: ApiKey, version: i16) -> Option<&'static Program> {
    let i = message_index(api)?;
    let m = &MESSAGES[i];
    if m.min <= version && version <= m.max {
        programs()[i].get((version - m.min) as usize)
    } else {
        None
    }
}

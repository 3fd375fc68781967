//! The kernel's BTF (`/sys/kernel/btf/vmlinux`), read with `btfparse`: the offsets of the
//! kernel's struct members the probes read (`task_struct.exit_code` for an exit's status, which
//! no tracepoint carries; and every field the raw tracepoint programs read from the
//! tracepoint's arguments), and the raw tracepoints' prototypes (`btf_trace_<name>`, the
//! typedef the kernel declares for each tracepoint since 5.5). aya 0.14 does not expose CO-RE
//! for such reads, so userspace reads the offsets here and hands them to the programs.
//!
//! A field may sit inside anonymous structs or unions (randstruct kernels and some distro
//! configurations wrap members that way); `btfparse` resolves a member through them and adds
//! their offsets.

use btfparse::{Integer32Value, Offset, Readable, TypeInformation, TypeVariant};

/// Why the offset could not be found; exits then carry no status (the runtime still has it).
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading /sys/kernel/btf/vmlinux: {0}")]
    Read(#[from] std::io::Error),
    #[error("parsing BTF: {message} ({kind:?})")]
    Parse {
        kind: btfparse::ErrorKind,
        message: String,
    },
    #[error("struct {name} not found in BTF")]
    MissingStruct { name: &'static str },
    #[error("member {member} of struct {name} not found in BTF")]
    MissingMember {
        name: &'static str,
        member: &'static str,
    },
    #[error("member {member} of struct {name} is a bitfield: the probe reads whole bytes")]
    Bitfield {
        name: &'static str,
        member: &'static str,
    },
    #[error("no prototype btf_trace_{tracepoint} in BTF (kernels before 5.5)")]
    MissingPrototype { tracepoint: &'static str },
    #[error("no value {value} of enum {name} in BTF")]
    MissingEnumValue {
        name: &'static str,
        value: &'static str,
    },
    #[error("no BTF: {0}")]
    Unreadable(String),
}

impl From<btfparse::Error> for BtfError {
    fn from(error: btfparse::Error) -> Self {
        // btfparse's error implements neither Display nor Error: keep its parts.
        Self::Parse {
            kind: error.kind(),
            message: error.message().to_owned(),
        }
    }
}

/// What the probes ask of the kernel's types; [`KernelTypes`] answers from BTF.
pub trait Types {
    /// The byte offset of `member` in struct `name`.
    fn member_offset(&self, name: &'static str, member: &'static str) -> Result<u32, BtfError> {
        self.path_offset(name, member, None)
    }
    /// The byte offset in struct `name` of `member` (a path: `memory.usage`), indexed by
    /// `index` when it is an array (`subsys[index]`).
    fn path_offset(
        &self,
        name: &'static str,
        member: &'static str,
        index: Option<u32>,
    ) -> Result<u32, BtfError>;
    /// The value of `value` in enum `name` (`memory_cgrp_id` in `cgroup_subsys_id`, whose
    /// values depend on the controllers the kernel was built with).
    fn enum_value(&self, name: &'static str, value: &'static str) -> Result<u32, BtfError>;
    /// The arguments a raw tracepoint program of `tracepoint` gets (its `TP_PROTO`, without
    /// the context pointer every one starts with).
    fn tracepoint_args(&self, tracepoint: &'static str) -> Result<Vec<Arg>, BtfError>;
}

/// What a raw tracepoint argument is, as far as the programs care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Pointer,
    Integer,
    Other,
}

/// The running kernel's types, parsed once (tens of milliseconds) and asked many times.
pub struct KernelTypes(TypeInformation);

impl KernelTypes {
    /// The running kernel's BTF.
    pub fn running() -> Result<Self, BtfError> {
        Self::parse(&std::fs::read("/sys/kernel/btf/vmlinux")?)
    }

    /// A raw BTF blob.
    pub fn parse(blob: &[u8]) -> Result<Self, BtfError> {
        Ok(Self(TypeInformation::new(&Blob(blob))?))
    }

    /// `id` with typedefs and qualifiers looked through.
    fn resolved(&self, mut id: u32) -> Option<TypeVariant> {
        loop {
            let kind = self.0.from_id(id)?;
            id = match &kind {
                TypeVariant::Typedef(t) => *t.tid(),
                TypeVariant::Const(t) => *t.tid(),
                TypeVariant::Volatile(t) => *t.tid(),
                TypeVariant::Restrict(t) => *t.tid(),
                _ => return Some(kind),
            };
        }
    }
}

impl Types for KernelTypes {
    fn path_offset(
        &self,
        name: &'static str,
        member: &'static str,
        index: Option<u32>,
    ) -> Result<u32, BtfError> {
        let types = &self.0;
        // Looked up among structs, not by name alone: a forward declaration or another kind
        // of type may share the name.
        let id = types
            .get()
            .iter()
            .find(|&(&id, kind)| {
                matches!(kind, TypeVariant::Struct(_)) && types.name_of(id).as_deref() == Some(name)
            })
            .map(|(&id, _)| id)
            .ok_or(BtfError::MissingStruct { name })?;
        let path = match index {
            Some(index) => format!("{member}[{index}]"),
            None => member.to_owned(),
        };
        match types.offset_of(id, &path) {
            Ok((_, Offset::ByteOffset(offset))) => Ok(offset),
            Ok((_, Offset::BitOffsetAndSize(..))) => Err(BtfError::Bitfield { name, member }),
            Err(e) if e.kind() == btfparse::ErrorKind::InvalidTypePath => {
                Err(BtfError::MissingMember { name, member })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn enum_value(&self, name: &'static str, value: &'static str) -> Result<u32, BtfError> {
        let types = &self.0;
        types
            .get()
            .values()
            .filter_map(|kind| match kind {
                TypeVariant::Enum(e) if e.name().as_deref() == Some(name) => Some(e),
                _ => None,
            })
            .flat_map(|e| e.named_value_list())
            .find(|v| v.name == value)
            .and_then(|v| match v.value {
                Integer32Value::Unsigned(v) => Some(v),
                Integer32Value::Signed(v) => u32::try_from(v).ok(),
            })
            .ok_or(BtfError::MissingEnumValue { name, value })
    }

    fn tracepoint_args(&self, tracepoint: &'static str) -> Result<Vec<Arg>, BtfError> {
        let missing = || BtfError::MissingPrototype { tracepoint };
        let typedef = self
            .0
            .id_of(&format!("btf_trace_{tracepoint}"))
            .ok_or_else(missing)?;
        let Some(TypeVariant::Ptr(pointer)) = self.resolved(typedef) else {
            return Err(missing());
        };
        let Some(TypeVariant::FuncProto(prototype)) = self.resolved(*pointer.tid()) else {
            return Err(missing());
        };
        Ok(prototype
            .parameter_list()
            .iter()
            // The first is the context (`void *__data`).
            .skip(1)
            .map(|parameter| match self.resolved(parameter.tid()) {
                Some(TypeVariant::Ptr(_)) => Arg::Pointer,
                Some(TypeVariant::Int(_) | TypeVariant::Enum(_)) => Arg::Integer,
                _ => Arg::Other,
            })
            .collect())
    }
}

/// A BTF blob in memory, as `btfparse` reads it.
struct Blob<'a>(&'a [u8]);

impl Readable for Blob<'_> {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.0.get(start..start.checked_add(buffer.len())?))
            .ok_or_else(|| {
                btfparse::Error::new(btfparse::ErrorKind::EOF, "read past the end of the blob")
            })?;
        buffer.copy_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BTF_MAGIC: u32 = 0xeb9f;
    const STRUCT: u32 = 4 << 24;
    const UNION: u32 = 5 << 24;

    /// A BTF blob whose `task_struct` puts `exit_code` at byte `0x7d0` inside an anonymous
    /// union at `0x700` that holds an anonymous struct at `0xd0`, as randstruct kernels wrap
    /// fields; `exit_signal` is a top-level member at `0x10`, `flags` a bitfield.
    fn synthetic() -> Vec<u8> {
        let strings = b"\0int\0task_struct\0exit_code\0exit_signal\0pad\0flags\0";
        let name = |s: &str| -> u32 {
            let needle = format!("\0{s}\0");
            let at = strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap();
            u32::try_from(at + 1).unwrap()
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // [1] int
        push(&[name("int"), 1 << 24, 4, 0x0100_0020]);
        // [2] struct { int pad @ 0; int exit_code @ 0xd0 }, anonymous
        push(&[0, STRUCT | 2, 0xd4]);
        push(&[name("pad"), 1, 0]);
        push(&[name("exit_code"), 1, 0xd0 * 8]);
        // [3] union { int pad; struct [2] }, anonymous
        push(&[0, UNION | 2, 0xd4]);
        push(&[name("pad"), 1, 0]);
        push(&[0, 2, 0]);
        // [4] struct task_struct { int exit_signal @ 0x10; union [3] @ 0x700;
        //     int flags:3 @ 0x800 } (kind_flag: member offsets carry bitfield sizes)
        push(&[name("task_struct"), (1 << 31) | STRUCT | 3, 0x900]);
        push(&[name("exit_signal"), 1, 0x10 * 8]);
        push(&[0, 3, 0x700 * 8]);
        push(&[name("flags"), 1, (3 << 24) | (0x800 * 8)]);
        let mut blob = Vec::new();
        blob.extend_from_slice(&(BTF_MAGIC | (1 << 16)).to_le_bytes());
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(strings);
        blob
    }

    fn member_offset(
        blob: &[u8],
        name: &'static str,
        member: &'static str,
    ) -> Result<u32, BtfError> {
        KernelTypes::parse(blob)?.member_offset(name, member)
    }

    #[test]
    fn exit_code_is_found_inside_anonymous_members() {
        assert_eq!(
            member_offset(&synthetic(), "task_struct", "exit_code").unwrap(),
            0x7d0
        );
    }

    #[test]
    fn top_level_members_missing_ones_and_bitfields() {
        let blob = synthetic();
        assert_eq!(
            member_offset(&blob, "task_struct", "exit_signal").unwrap(),
            0x10
        );
        assert!(matches!(
            member_offset(&blob, "task_struct", "exit_state"),
            Err(BtfError::MissingMember { .. })
        ));
        assert!(matches!(
            member_offset(&blob, "task_struct", "flags"),
            Err(BtfError::Bitfield { .. })
        ));
        assert!(matches!(
            member_offset(&blob, "mm_struct", "pgd"),
            Err(BtfError::MissingStruct { .. })
        ));
        assert!(matches!(
            KernelTypes::parse(&blob)
                .unwrap()
                .tracepoint_args("mark_victim"),
            Err(BtfError::MissingPrototype { .. })
        ));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let blob = synthetic();
        for len in 0..blob.len() {
            assert!(
                member_offset(&blob[..len], "task_struct", "exit_code").is_err(),
                "len {len}"
            );
        }
    }

    /// The running kernel's BTF, where it has one: the prototypes and members the raw
    /// programs read are there (this machine: 6.18).
    #[test]
    fn the_running_kernels_types_have_what_the_raw_programs_read() {
        let Ok(types) = KernelTypes::running() else {
            return;
        };
        assert_eq!(
            types.tracepoint_args("cgroup_mkdir").unwrap(),
            [Arg::Pointer, Arg::Pointer]
        );
        assert_eq!(
            types.tracepoint_args("sched_process_exec").unwrap(),
            [Arg::Pointer, Arg::Integer, Arg::Pointer]
        );
        assert_eq!(
            types.tracepoint_args("sched_process_exit").unwrap()[0],
            Arg::Pointer
        );
        for (name, member) in [
            ("cgroup", "root"),
            ("cgroup_root", "hierarchy_id"),
            ("cgroup", "level"),
            ("cgroup", "kn"),
            ("kernfs_node", "id"),
            ("linux_binprm", "filename"),
            ("task_struct", "pid"),
        ] {
            assert!(types.member_offset(name, member).is_ok(), "{name}.{member}");
        }
    }
}

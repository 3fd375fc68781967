//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find the offsets of the few
//! `task_struct` fields the exit probe reads (exit code, pid namespace number). Tracepoints do
//! not carry them, kprobes and fentry are not available everywhere, and aya 0.14 does not
//! expose CO-RE for such reads, so userspace reads the offsets here and hands them to the
//! programs as globals.

/// Why the offsets could not be found; the exit probe then carries no exit details.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not a BTF blob (bad magic or header)")]
    BadHeader,
    #[error("BTF blob truncated at byte {at}")]
    Truncated { at: usize },
    #[error("unknown BTF kind {kind} (a newer kernel?)")]
    UnknownKind { kind: u32 },
    #[error("struct {name} not found in BTF")]
    MissingStruct { name: &'static str },
    #[error("member {member} of struct {name} not found in BTF")]
    MissingMember {
        name: &'static str,
        member: &'static str,
    },
}

/// Offsets (bytes) and sizes of the kernel fields the exit probe reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.exit_code` (wait status: `code << 8 | signal`).
    pub task_exit_code: u32,
    /// `task_struct.group_leader` (a `struct task_struct *`).
    pub task_group_leader: u32,
    /// `task_struct.thread_pid` (a `struct pid *`).
    pub task_thread_pid: u32,
    /// `pid.level` (depth of the pid namespace).
    pub pid_level: u32,
    /// `pid.numbers` (array of `struct upid`, one per namespace level).
    pub pid_numbers: u32,
    /// `upid.nr`.
    pub upid_nr: u32,
    /// `sizeof(struct upid)`.
    pub upid_size: u32,
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// One struct's name, size and members (name, bit offset).
struct StructInfo<'a> {
    name: &'a str,
    size: u32,
    members: Vec<(&'a str, u32)>,
}

impl KernelOffsets {
    /// Reads the offsets from a raw BTF blob (little-endian, as on x86_64 and arm64).
    pub fn from_btf(blob: &[u8]) -> Result<Self, BtfError> {
        let structs = parse_structs(blob, &["task_struct", "pid", "upid"])?;
        let find = |name: &'static str| {
            structs
                .iter()
                .find(|s| s.name == name)
                .ok_or(BtfError::MissingStruct { name })
        };
        let member = |name: &'static str, member: &'static str| -> Result<u32, BtfError> {
            find(name)?
                .members
                .iter()
                .find(|(m, _)| *m == member)
                .map(|(_, bits)| bits / 8)
                .ok_or(BtfError::MissingMember { name, member })
        };
        Ok(Self {
            task_exit_code: member("task_struct", "exit_code")?,
            task_group_leader: member("task_struct", "group_leader")?,
            task_thread_pid: member("task_struct", "thread_pid")?,
            pid_level: member("pid", "level")?,
            pid_numbers: member("pid", "numbers")?,
            upid_nr: member("upid", "nr")?,
            upid_size: find("upid")?.size,
        })
    }

    /// The probes' view of these offsets.
    pub fn probe_config(&self) -> plegd_common::ProbeConfig {
        plegd_common::ProbeConfig {
            task_exit_code: self.task_exit_code,
            task_group_leader: self.task_group_leader,
            task_thread_pid: self.task_thread_pid,
            pid_level: self.pid_level,
            pid_numbers: self.pid_numbers,
            upid_nr: self.upid_nr,
            upid_size: self.upid_size,
            valid: 1,
        }
    }

    /// Reads the running kernel's BTF.
    pub fn from_running_kernel() -> Result<Self, std::io::Error> {
        let blob = std::fs::read("/sys/kernel/btf/vmlinux")?;
        Self::from_btf(&blob).map_err(std::io::Error::other)
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32, BtfError> {
        let bytes = self
            .data
            .get(self.at..self.at + 4)
            .ok_or(BtfError::Truncated { at: self.at })?;
        self.at += 4;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn skip(&mut self, bytes: usize) -> Result<(), BtfError> {
        if self.at + bytes > self.data.len() {
            return Err(BtfError::Truncated { at: self.at });
        }
        self.at += bytes;
        Ok(())
    }
}

/// Walks the type section and returns the named structs (first definition of each name).
fn parse_structs<'a>(blob: &'a [u8], wanted: &[&str]) -> Result<Vec<StructInfo<'a>>, BtfError> {
    let mut header = Reader { data: blob, at: 0 };
    let magic_version = header.u32()?;
    if magic_version & 0xffff != u32::from(BTF_MAGIC) {
        return Err(BtfError::BadHeader);
    }
    let header_len = header.u32()? as usize;
    let (type_off, type_len) = (header.u32()? as usize, header.u32()? as usize);
    let (str_off, str_len) = (header.u32()? as usize, header.u32()? as usize);
    let section = |off: usize, len: usize| {
        let start = header_len.checked_add(off).ok_or(BtfError::BadHeader)?;
        let end = start.checked_add(len).ok_or(BtfError::BadHeader)?;
        blob.get(start..end)
            .ok_or(BtfError::Truncated { at: start })
    };
    let types = section(type_off, type_len)?;
    let strings = section(str_off, str_len)?;
    let name_at = |offset: u32| -> &'a str {
        let tail = strings.get(offset as usize..).unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).unwrap_or_default()
    };

    let mut found: Vec<StructInfo<'a>> = Vec::new();
    let mut reader = Reader { data: types, at: 0 };
    while reader.at < types.len() {
        let name_off = reader.u32()?;
        let info = reader.u32()?;
        let size = reader.u32()?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        match kind {
            KIND_STRUCT | KIND_UNION => {
                let name = name_at(name_off);
                let keep = kind == KIND_STRUCT
                    && wanted.contains(&name)
                    && !found.iter().any(|s| s.name == name);
                let mut members = Vec::with_capacity(if keep { vlen } else { 0 });
                for _ in 0..vlen {
                    let member_name = reader.u32()?;
                    let _member_type = reader.u32()?;
                    let offset = reader.u32()?;
                    // With kind_flag, the top 8 bits are a bitfield size.
                    let bits = if kind_flag {
                        offset & 0x00ff_ffff
                    } else {
                        offset
                    };
                    if keep {
                        members.push((name_at(member_name), bits));
                    }
                }
                if keep {
                    found.push(StructInfo {
                        name,
                        size,
                        members,
                    });
                }
            }
            kind => reader.skip(trailing_bytes(kind, vlen)?)?,
        }
    }
    Ok(found)
}

/// Bytes that follow a type's common header, by kind (see the kernel's Documentation/bpf/btf.rst).
fn trailing_bytes(kind: u32, vlen: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        // INT, VAR, DECL_TAG: one u32.
        1 | 14 | 17 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG: nothing.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // ARRAY: type, index type, nelems.
        3 => 12,
        // ENUM, FUNC_PROTO: vlen pairs.
        6 | 13 => vlen * 8,
        // DATASEC, ENUM64: vlen triples.
        15 | 19 => vlen * 12,
        kind => return Err(BtfError::UnknownKind { kind }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with an INT, a PTR, and the three structs.
    fn synthetic() -> Vec<u8> {
        let strings =
            b"\0int\0task_struct\0exit_code\0group_leader\0thread_pid\0pid\0level\0numbers\0upid\0nr\0";
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
        push(&[name("int"), 1 << 24, 4, 0x0100_0020]); // INT
        push(&[0, 2 << 24, 1]); // PTR to int
        // struct task_struct { ...; int exit_code @ 0x7d0 bytes; struct pid *thread_pid @ 0x9a0 }
        push(&[name("task_struct"), (4 << 24) | 3, 0x2000]);
        push(&[name("exit_code"), 1, 0x7d0 * 8]);
        push(&[name("group_leader"), 2, 0x8f0 * 8]);
        push(&[name("thread_pid"), 2, 0x9a0 * 8]);
        // struct pid { unsigned int level @ 4; struct upid numbers[] @ 0x50 } (kind_flag set)
        push(&[name("pid"), (1 << 31) | (4 << 24) | 2, 0x60]);
        push(&[name("level"), 1, 4 * 8]);
        push(&[name("numbers"), 1, 0x50 * 8]);
        // struct upid { int nr @ 0; ns @ 8 }, size 16
        push(&[name("upid"), (4 << 24) | 1, 16]);
        push(&[name("nr"), 1, 0]);
        let mut blob = Vec::new();
        blob.extend_from_slice(&(u32::from(BTF_MAGIC) | (1 << 16)).to_le_bytes());
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

    #[test]
    fn offsets_are_read_from_struct_members() {
        let offsets = KernelOffsets::from_btf(&synthetic()).unwrap();
        assert_eq!(
            offsets,
            KernelOffsets {
                task_exit_code: 0x7d0,
                task_group_leader: 0x8f0,
                task_thread_pid: 0x9a0,
                pid_level: 4,
                pid_numbers: 0x50,
                upid_nr: 0,
                upid_size: 16,
            }
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let blob = synthetic();
        for len in 0..blob.len() {
            assert!(KernelOffsets::from_btf(&blob[..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn the_running_kernel_has_the_fields() {
        // The machines this project runs on have BTF (see DESIGN.md); a kernel without it
        // fails here with a clear error rather than passing vacuously.
        let offsets =
            KernelOffsets::from_running_kernel().expect("/sys/kernel/btf/vmlinux readable");
        assert!(offsets.task_exit_code > 0 && offsets.task_thread_pid > 0);
        assert!(offsets.upid_size >= 8);
    }
}

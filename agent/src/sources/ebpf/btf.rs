//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find `task_struct.exit_code`,
//! the one kernel field the exit probe reads beyond its tracepoint (which carries no exit
//! status). kprobes and fentry are not available everywhere and aya 0.14 does not expose CO-RE
//! for such reads, so userspace reads the offset here and hands it to the programs.

/// Why the offset could not be found; exits then carry no status (the runtime still has it).
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading /sys/kernel/btf/vmlinux: {0}")]
    Read(#[from] std::io::Error),
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

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// One struct's name and members (name, bit offset).
struct StructInfo<'a> {
    name: &'a str,
    members: Vec<(&'a str, u32)>,
}

/// The byte offset of `task_struct.exit_code` (a wait status: `code << 8 | signal`) in a raw
/// BTF blob (little-endian, as on x86_64 and arm64).
pub fn exit_code_offset(blob: &[u8]) -> Result<u32, BtfError> {
    const STRUCT: &str = "task_struct";
    const MEMBER: &str = "exit_code";
    let structs = parse_structs(blob, &[STRUCT])?;
    let task = structs
        .first()
        .ok_or(BtfError::MissingStruct { name: STRUCT })?;
    task.members
        .iter()
        .find(|(m, _)| *m == MEMBER)
        .map(|(_, bits)| bits / 8)
        .ok_or(BtfError::MissingMember {
            name: STRUCT,
            member: MEMBER,
        })
}

/// [`exit_code_offset`] of the running kernel.
pub fn running_kernel_exit_code_offset() -> Result<u32, BtfError> {
    exit_code_offset(&std::fs::read("/sys/kernel/btf/vmlinux")?)
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
        let _size_or_type = reader.u32()?;
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
                    found.push(StructInfo { name, members });
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
    fn the_exit_code_offset_is_read_from_task_struct() {
        assert_eq!(exit_code_offset(&synthetic()).unwrap(), 0x7d0);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let blob = synthetic();
        for len in 0..blob.len() {
            assert!(exit_code_offset(&blob[..len]).is_err(), "len {len}");
        }
    }
}

//! Reading an NVRTC cubin: the ELF header (CUDA machine type, target architecture), the
//! symbol table (kernel entry points) and each kernel's parameter table (`.nv.info.<kernel>`,
//! `EIATTR_KPARAM_INFO`), which says where each argument goes in the parameter buffer.

use std::collections::HashMap;

use crate::status::{self, CUresult};

/// `EM_CUDA`.
pub(crate) const EM_CUDA: u16 = 190;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
/// `st_other` flag of a kernel entry point.
const STO_CUDA_ENTRY: u8 = 0x10;
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIFMT_SVAL: u8 = 0x04;

/// One kernel parameter: its position in the parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Param {
    pub(crate) ordinal: u16,
    pub(crate) offset: u16,
    pub(crate) size: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelInfo {
    /// By ordinal.
    pub(crate) params: Vec<Param>,
    /// Bytes of the parameter buffer (`EIATTR_PARAM_CBANK`).
    pub(crate) param_bytes: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Cubin {
    /// 10 * major + minor.
    pub(crate) arch: u32,
    pub(crate) kernels: HashMap<String, KernelInfo>,
    /// The CUDA toolkit that built it, (major, minor), from the `.note.nv.tkinfo` note
    /// ("Cuda compilation tools, release 13.5, V13.5.37"); `None` when the cubin has none.
    pub(crate) toolkit: Option<(u32, u32)>,
}

/// The "release M.m" of a `.note.nv.tkinfo` section.
fn toolkit_release(note: &[u8]) -> Option<(u32, u32)> {
    const KEY: &[u8] = b"release ";
    let at = note.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let text: String = note[at..]
        .iter()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .map(|&c| char::from(c))
        .collect();
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The PTX ISA version (`.version M.m`) of a PTX text, if `image` is one.
pub(crate) fn ptx_isa(image: &[u8]) -> Option<(u32, u32)> {
    let text = std::str::from_utf8(image).ok()?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.trim_start_matches(".version").trim().split_once('.')?;
    Some((major.parse().ok()?, minor.trim().parse().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// The size of the ELF image at `image`, from its headers.
///
/// # Safety
/// `image` must point at a readable ELF image (the driver's contract: the caller passes a
/// whole cubin), or at least 64 readable bytes that are not one.
pub(crate) unsafe fn image_len(image: *const u8) -> Result<usize, CUresult> {
    // SAFETY: the caller promises 64 readable bytes.
    let head = unsafe { std::slice::from_raw_parts(image, 64) };
    if &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return Err(status::INVALID_IMAGE);
    }
    let bad = status::INVALID_IMAGE;
    let shoff = u64_at(head, 0x28).ok_or(bad)?;
    let shentsize = usize::from(u16_at(head, 0x3a).ok_or(bad)?);
    let shnum = usize::from(u16_at(head, 0x3c).ok_or(bad)?);
    if shentsize != 64 || shnum == 0 || shnum > 4096 || shoff > 1 << 30 {
        return Err(bad);
    }
    let table_end = shoff + shnum * shentsize;
    // SAFETY: the section table lies inside the image the caller passed.
    let table = unsafe { std::slice::from_raw_parts(image.add(shoff), shnum * shentsize) };
    let mut end = table_end;
    for i in 0..shnum {
        let s = &table[i * 64..(i + 1) * 64];
        if u32_at(s, 4) != Some(SHT_NOBITS) {
            end = end.max(u64_at(s, 0x18).ok_or(bad)? + u64_at(s, 0x20).ok_or(bad)?);
        }
    }
    if end > 1 << 30 {
        return Err(bad);
    }
    Ok(end)
}

struct Section<'a> {
    name: &'a str,
    kind: u32,
    link: usize,
    data: &'a [u8],
}

fn sections(b: &[u8]) -> Option<Vec<Section<'_>>> {
    let shoff = u64_at(b, 0x28)?;
    let shnum = usize::from(u16_at(b, 0x3c)?);
    let shstrndx = usize::from(u16_at(b, 0x3e)?);
    let header = |i: usize| b.get(shoff + i * 64..shoff + (i + 1) * 64);
    let data = |s: &[u8]| -> Option<&[u8]> {
        if u32_at(s, 4)? == SHT_NOBITS {
            return Some(&[]);
        }
        let off = u64_at(s, 0x18)?;
        b.get(off..off + u64_at(s, 0x20)?)
    };
    let names = data(header(shstrndx)?)?;
    (0..shnum)
        .map(|i| {
            let s = header(i)?;
            Some(Section {
                name: cstr(names, u32_at(s, 0)? as usize)?,
                kind: u32_at(s, 4)?,
                link: u32_at(s, 0x28)? as usize,
                data: data(s)?,
            })
        })
        .collect()
}

fn cstr(table: &[u8], at: usize) -> Option<&str> {
    let rest = table.get(at..)?;
    let end = rest.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// The parameter table in one `.nv.info.<kernel>` section.
fn kernel_info(nv_info: &[u8]) -> Option<KernelInfo> {
    let mut params = Vec::new();
    let mut param_bytes = 0;
    let mut at = 0;
    while at + 4 <= nv_info.len() {
        let (fmt, attr) = (nv_info[at], nv_info[at + 1]);
        if fmt != EIFMT_SVAL {
            at += 4;
            continue;
        }
        let len = usize::from(u16_at(nv_info, at + 2)?);
        let v = nv_info.get(at + 4..at + 4 + len)?;
        match attr {
            EIATTR_KPARAM_INFO if len >= 12 => params.push(Param {
                ordinal: u16_at(v, 4)?,
                offset: u16_at(v, 6)?,
                size: ((u32_at(v, 8)? >> 18) & 0x3fff) as u16,
            }),
            EIATTR_PARAM_CBANK if len >= 8 => param_bytes = usize::from(u16_at(v, 6)?),
            _ => {}
        }
        at += 4 + len;
    }
    params.sort_by_key(|p| p.ordinal);
    let dense = params
        .iter()
        .enumerate()
        .all(|(i, p)| usize::from(p.ordinal) == i);
    dense.then_some(KernelInfo {
        params,
        param_bytes,
    })
}

/// Parses a whole cubin. Not an ELF, not `EM_CUDA`, or unreadable tables:
/// `CUDA_ERROR_INVALID_IMAGE`.
pub(crate) fn parse(b: &[u8]) -> Result<Cubin, CUresult> {
    let bad = status::INVALID_IMAGE;
    if u16_at(b, 0x12) != Some(EM_CUDA) {
        return Err(bad);
    }
    let flags = u32_at(b, 0x30).ok_or(bad)?;
    // CUDA 12.8+ cubins keep the SM in bits 8..16 of e_flags; older ones in bits 0..8.
    let arch = match (flags >> 8) & 0xff {
        a if a >= 20 => a,
        _ => flags & 0xff,
    };
    let secs = sections(b).ok_or(bad)?;
    let symtab = secs.iter().find(|s| s.kind == SHT_SYMTAB).ok_or(bad)?;
    let strtab = secs.get(symtab.link).ok_or(bad)?.data;
    let mut kernels = HashMap::new();
    for sym in symtab.data.chunks_exact(24) {
        let (info, other) = (sym[4], sym[5]);
        let entry =
            info & 0xf == STT_FUNC && info >> 4 == STB_GLOBAL && other & STO_CUDA_ENTRY != 0;
        if !entry {
            continue;
        }
        let name = cstr(strtab, u32_at(sym, 0).ok_or(bad)? as usize).ok_or(bad)?;
        let section = format!(".nv.info.{name}");
        let info = match secs.iter().find(|s| s.name == section) {
            Some(s) => kernel_info(s.data).ok_or(bad)?,
            None => KernelInfo {
                params: Vec::new(),
                param_bytes: 0,
            },
        };
        kernels.insert(name.to_string(), info);
    }
    let toolkit = secs
        .iter()
        .find(|s| s.name == ".note.nv.tkinfo")
        .and_then(|s| toolkit_release(s.data));
    Ok(Cubin {
        arch,
        kernels,
        toolkit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_tables_read_offsets_and_sizes() {
        // `.nv.info.stoker_fill_pattern` as NVRTC 13.5 writes it for sm_90 (abridged).
        let info = [
            0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0, 0x02, 0x00, 0x10, 0x00, 0x00, 0xf0, 0x11, 0x00,
            0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0, 0x01, 0x00, 0x08, 0x00, 0x00, 0xf0, 0x21, 0x00,
            0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x21, 0x00,
            0x03, 0x50, 0x00, 0x00, 0x04, 0x0a, 0x08, 0x00, 0x13, 0, 0, 0, 0x10, 0x02, 0x14, 0x00,
        ];
        let k = kernel_info(&info).unwrap();
        let got: Vec<(u16, u16)> = k.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(got, vec![(0, 8), (8, 8), (16, 4)]);
        assert_eq!(k.param_bytes, 20);
    }

    #[test]
    fn non_cuda_elf_is_an_invalid_image() {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[0x12] = 62; // EM_X86_64
        assert_eq!(parse(&b).unwrap_err(), status::INVALID_IMAGE);
    }
}

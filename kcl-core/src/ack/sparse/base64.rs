//! URL-safe base64 without padding (RFC 4648 §5): a value goes into a text attribute of the
//! lease row, and forty lines here spare kcl-core a dependency.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

pub(super) fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 0x3f]));
        }
    }
    out
}

pub(super) fn decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| {
        let at = ALPHABET.iter().position(|&a| a == c)?;
        u32::try_from(at).ok()
    };
    let text = text.as_bytes();
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
        // Bits past the last byte must be zero (one text for one value).
        let used = 8 * (chunk.len() - 1);
        if n & ((1 << (24 - used)) - 1) != 0 {
            return None;
        }
    }
    Some(out)
}

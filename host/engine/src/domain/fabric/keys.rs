//! Remote keys the libfabric domain chooses itself (providers without
//! `FI_MR_PROV_KEY`), built so an initiator can check them before posting.
//!
//! The software providers accept any key (design §7: `shm` even writes
//! through a wrong one), so a key carries a check field derived from the
//! rest of it, and an initiator refuses a key whose check does not match —
//! a corrupted or made-up key fails as [`UnknownKey`] without reaching the
//! wire. This catches accidents, not forgeries (the field is a public
//! function of the key); hardware providers use their own keys and check
//! them in the NIC.
//!
//! Layouts (64 bits):
//!
//! ```text
//! virtual addressing:  | nonce (32) | check = mix(nonce) (32) |
//! offset addressing:   | check = mix(base) (16) | region base (48) |
//! ```
//!
//! With offset addressing (`FI_MR_VIRT_ADDR` not granted, e.g.
//! `tcp;ofi_rxm`) the region's base address rides in the key, so the
//! absolute address an `MrDesc` yields becomes an offset at the initiator.
//!
//! [`UnknownKey`]: crate::error::ProtectionCheck::UnknownKey

/// Bits of a region base in an offset-addressing key.
pub const BASE_BITS: u32 = 48;
const BASE_MASK: u64 = (1 << BASE_BITS) - 1;

/// A 64-bit mixer (the splitmix64 finaliser).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key for nonce `n` (its low 32 bits) under virtual addressing.
pub fn virt_key(n: u64) -> u64 {
    let nonce = n & 0xffff_ffff;
    (nonce << 32) | (mix(nonce) & 0xffff_ffff)
}

/// Whether a virtual-addressing key's check matches.
pub fn check_virt(key: u64) -> bool {
    virt_key(key >> 32) == key
}

/// The key of a region at `base` under offset addressing; `None` if the
/// base does not fit in [`BASE_BITS`].
pub fn offset_key(base: u64) -> Option<u64> {
    (base <= BASE_MASK).then(|| ((mix(base) & 0xffff) << BASE_BITS) | base)
}

/// The region base an offset-addressing key carries, if its check
/// matches.
pub fn offset_base(key: u64) -> Option<u64> {
    let base = key & BASE_MASK;
    (offset_key(base) == Some(key)).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn virt_keys_check_and_detect_check_bit_flips(n in any::<u64>(), bit in 0u32..32) {
            let k = virt_key(n);
            prop_assert!(check_virt(k));
            prop_assert!(!check_virt(k ^ (1 << bit)));
        }

        #[test]
        fn offset_keys_round_trip(base in 0u64..(1 << 47), bit in 48u32..64) {
            let k = offset_key(base).unwrap();
            prop_assert_eq!(offset_base(k), Some(base));
            prop_assert_eq!(offset_base(k ^ (1 << bit)), None);
        }
    }

    #[test]
    fn base_bit_flips_are_caught_almost_always() {
        // A flipped base bit passes only on a 16-bit check collision.
        let mut caught = 0;
        let mut total = 0;
        for i in 0..512u64 {
            let base = 0x7f00_0000_0000 + i * 4096;
            let k = offset_key(base).unwrap();
            for bit in 0..BASE_BITS {
                total += 1;
                caught += usize::from(offset_base(k ^ (1 << bit)).is_none());
            }
        }
        assert!(caught * 1000 >= total * 999, "{caught} of {total}");
    }

    #[test]
    fn bases_beyond_48_bits_have_no_key() {
        assert_eq!(offset_key(1 << 48), None);
    }
}

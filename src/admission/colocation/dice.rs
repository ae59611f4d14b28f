//! The random source of profile probabilities, injected so tests are deterministic.

/// A roll in [0, 99].
pub trait Dice: Send + Sync {
    fn roll_percent(&self) -> u32;
}

/// The operating system's randomness.
pub struct SystemDice;

impl Dice for SystemDice {
    fn roll_percent(&self) -> u32 {
        let mut bytes = [0u8; 4];
        // The system source does not fail on Linux; if it did, 0 applies the profile.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
        u32::from_le_bytes(bytes) % 100
    }
}

/// Always the same roll (tests, demos).
pub struct FixedDice(pub u32);

impl Dice for FixedDice {
    fn roll_percent(&self) -> u32 {
        self.0
    }
}

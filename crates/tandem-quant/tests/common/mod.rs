//! Deterministic test data shared by the integration tests.

/// splitmix64: a tiny deterministic PRNG.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn gauss(&mut self) -> f32 {
        let u1 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// Elements per test row: four K-quant blocks, 32 of the small blocks.
pub const ROW: usize = 1024;

/// Named kinds of rows, each `ROW` elements.
pub fn rows(seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let mut r = Rng::new(seed);
    let mut gauss = |scale: f32, offset: f32| -> Vec<f32> { (0..ROW).map(|_| r.gauss() * scale + offset).collect() };
    let mut rows = vec![
        ("gauss", gauss(1.0, 0.0)),
        ("gauss-small", gauss(0.01, 0.0)),
        ("gauss-large", gauss(100.0, 0.0)),
        ("gauss-offset", gauss(1.0, 2.0)),
    ];
    let mut outliers = gauss(1.0, 0.0);
    let mut r2 = Rng::new(seed ^ 0x55);
    for _ in 0..8 {
        let i = (r2.next_u64() % ROW as u64) as usize;
        outliers[i] *= 20.0;
    }
    rows.push(("outliers", outliers));
    rows.push(("uniform", (0..ROW).map(|_| r2.uniform() * 2.0 - 1.0).collect()));
    rows.push(("constant", vec![3.25; ROW]));
    rows.push(("negative-constant", vec![-0.75; ROW]));
    rows
}

//! The CPU instruction-set levels the kernels come in, below both the kernels (`dot`) and the thread
//! pool and activation quantizers that use them.

/// An instruction-set level. A value other than `Scalar` only ever drives kernels after a check
/// that the running CPU has it ([`Isa::is_available`]); unavailable levels fall back to scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, any target.
    Scalar,
    /// x86 AVX2 + FMA + F16C.
    Avx2,
    /// x86 AVX-512 F/BW/VL/DQ + VNNI (with AVX2, FMA, F16C).
    Avx512,
}

impl Isa {
    /// The best level this CPU supports, capped by [`Isa::ceiling`] (detected once, then cached by
    /// the standard library).
    pub fn detect() -> Isa {
        let best = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar);
        Isa::ceiling().map_or(best, |cap| best.min(cap))
    }

    /// The highest level the user allows, from the environment variable `TANDEM_CPU_ISA`
    /// (`scalar`, `avx2` or `avx512`): a way to run as a machine without the wider vectors would,
    /// which gives the same bits more slowly. An unknown value is reported once and ignored.
    pub fn ceiling() -> Option<Isa> {
        static CEILING: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *CEILING.get_or_init(|| {
            let value = std::env::var("TANDEM_CPU_ISA").ok()?;
            let cap = Isa::from_name(value.trim());
            if cap.is_none() {
                eprintln!("tandem: ignoring TANDEM_CPU_ISA={value:?} (expected scalar, avx2 or avx512)");
            }
            cap
        })
    }

    /// The level named `name` (`scalar`, `avx2`, `avx512`; case-insensitive).
    pub fn from_name(name: &str) -> Option<Isa> {
        match name.to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx512-vnni" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// Every level this CPU supports, lowest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.is_available())
            .collect()
    }

    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// `self` if the CPU has it, else `Scalar`: the gate before any SIMD kernel runs.
    pub fn or_scalar(self) -> Isa {
        if self.is_available() {
            self
        } else {
            Isa::Scalar
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512-vnni",
        }
    }
}

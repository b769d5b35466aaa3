//! The few NVML queries a record needs (clocks, clock limiters, power limit), loaded at run time
//! from the driver's `libnvidia-ml.so.1` like the rest of CUDA: no build-time dependency, and a
//! host without NVML still runs, its records simply lack these fields.

use crate::profile::Clocks;
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CString};

type Device = *mut c_void;
const SUCCESS: i32 = 0;
const CLOCK_SM: c_uint = 1;
const CLOCK_MEM: c_uint = 2;

/// NVML's clock event reason bits (nvml.h, `nvmlClocksEventReason*`), by name.
const REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// What NVML says of the board itself: part of the device fingerprint.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Board {
    /// "SXM", "PCIe", ... from the product name, or inferred from the default power limit
    /// (SXM boards of this class are rated well above 450 W, PCIe cards at or below).
    pub form_factor: String,
    pub power_limit_w: Option<f64>,
    pub default_power_limit_w: Option<f64>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_mem_clock_mhz: Option<u32>,
}

pub struct Nvml {
    lib: Library,
    device: Device,
}

// SAFETY: NVML is thread-safe (nvml.h: "all NVML functions are thread-safe"); the handle is an
// opaque token valid until shutdown, which never happens while `Nvml` lives.
unsafe impl Send for Nvml {}
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Opens NVML and finds the device on `pci_bus_id` ("00000000:1B:00.0"); `None` when either fails.
    pub fn open(pci_bus_id: &str) -> Option<Nvml> {
        // SAFETY: loading the driver's own library; its initialisers are NVML's.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }.ok()?;
        let id = CString::new(pci_bus_id).ok()?;
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: the signatures are those of nvml.h; `device` is an out-parameter.
        unsafe {
            let init: Symbol<unsafe extern "C" fn() -> i32> = lib.get(b"nvmlInit_v2\0").ok()?;
            (init() == SUCCESS).then_some(())?;
            let by_bus: Symbol<unsafe extern "C" fn(*const c_char, *mut Device) -> i32> =
                lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0").ok()?;
            (by_bus(id.as_ptr(), &mut device) == SUCCESS).then_some(())?;
        }
        Some(Nvml { lib, device })
    }

    /// Calls a `nvmlDeviceGet*(device, [arg,] *out)` query; `None` on any error.
    fn query<T: Default>(&self, name: &[u8], arg: Option<c_uint>) -> Option<T> {
        let mut out = T::default();
        // SAFETY: every name passed here is an NVML getter of the matching shape (nvml.h), with
        // `T` its out-parameter type (unsigned int or unsigned long long).
        let status = unsafe {
            match arg {
                Some(a) => {
                    let f: Symbol<unsafe extern "C" fn(Device, c_uint, *mut T) -> i32> = self.lib.get(name).ok()?;
                    f(self.device, a, &mut out)
                }
                None => {
                    let f: Symbol<unsafe extern "C" fn(Device, *mut T) -> i32> = self.lib.get(name).ok()?;
                    f(self.device, &mut out)
                }
            }
        };
        (status == SUCCESS).then_some(out)
    }

    /// Current SM and memory clocks in MHz.
    pub fn clocks_now(&self) -> Option<(u32, u32)> {
        let sm: c_uint = self.query(b"nvmlDeviceGetClockInfo\0", Some(CLOCK_SM))?;
        let mem: c_uint = self.query(b"nvmlDeviceGetClockInfo\0", Some(CLOCK_MEM))?;
        Some((sm, mem))
    }

    /// Names of whatever holds the clocks below their maximum right now.
    pub fn limited_by(&self) -> Vec<String> {
        let bits: Option<c_ulonglong> = self
            .query(b"nvmlDeviceGetCurrentClocksEventReasons\0", None)
            .or_else(|| self.query(b"nvmlDeviceGetCurrentClocksThrottleReasons\0", None));
        reason_names(bits.unwrap_or(0))
    }

    pub fn board(&self, device_name: &str) -> Board {
        let watts = |name: &[u8]| self.query::<c_uint>(name, None).map(|mw| mw as f64 / 1000.0);
        let default_power_limit_w = watts(b"nvmlDeviceGetPowerManagementDefaultLimit\0");
        Board {
            form_factor: form_factor(device_name, default_power_limit_w),
            power_limit_w: watts(b"nvmlDeviceGetPowerManagementLimit\0"),
            default_power_limit_w,
            max_sm_clock_mhz: self.query(b"nvmlDeviceGetMaxClockInfo\0", Some(CLOCK_SM)),
            max_mem_clock_mhz: self.query(b"nvmlDeviceGetMaxClockInfo\0", Some(CLOCK_MEM)),
        }
    }
}

/// Clock readings around a timed stretch: `start` taken before it, the rest after.
pub fn clocks_around(start: Option<(u32, u32)>, nvml: &Nvml) -> Option<Clocks> {
    let (s, e) = (start?, nvml.clocks_now()?);
    Some(Clocks { sm_mhz: [s.0, e.0], mem_mhz: [s.1, e.1], limited_by: nvml.limited_by() })
}

fn reason_names(bits: u64) -> Vec<String> {
    REASONS.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| n.to_string()).collect()
}

fn form_factor(name: &str, default_power_limit_w: Option<f64>) -> String {
    let n = name.to_uppercase();
    if n.contains("PCIE") {
        "PCIe".into()
    } else if n.contains("SXM") {
        "SXM".into()
    } else if n.contains("NVL") {
        "NVL".into()
    } else {
        match default_power_limit_w {
            Some(w) if w > 450.0 => "SXM (inferred from power limit)".into(),
            Some(_) => "PCIe (inferred from power limit)".into(),
            None => "unknown".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_named_bit_by_bit() {
        assert_eq!(reason_names(0), Vec::<String>::new());
        assert_eq!(reason_names(0x1 | 0x4), vec!["gpu_idle", "sw_power_cap"]);
    }

    #[test]
    fn form_factor_comes_from_the_name_first_then_the_power_limit() {
        assert_eq!(form_factor("NVIDIA H100 PCIe", Some(350.0)), "PCIe");
        assert_eq!(form_factor("NVIDIA H100 80GB HBM3", Some(700.0)), "SXM (inferred from power limit)");
        assert_eq!(form_factor("NVIDIA H100 80GB HBM3", None), "unknown");
    }
}

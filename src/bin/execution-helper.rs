//! `execution-helper`: the fixed program run inside an executor Pod (and by the local
//! transport). One JSON request on stdin, one JSON envelope line on stdout; see
//! `execution_provider::helper`.

// The supervisor's canary feature disables its claim-deadline kill, for the simulator's teeth
// test only (`sim/canary.sh`); a helper that runs in an executor is never built with it.
#[cfg(feature = "sim-supervisor-canary")]
compile_error!("the sim-supervisor-canary feature is for the simulator's teeth test only");

fn main() -> std::process::ExitCode {
    execution_provider::helper::main_entry()
}

use clap::{Parser, Subcommand};
use kernelsight::cli;

/// Predicts how an LLM serves on a GPU deployment, down to each kernel.
#[derive(Debug, Parser)]
#[command(name = "kernelsight", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// GPU spec sheets: `hw list`, `hw show ID`.
    Hw(cli::hw::HwArgs),
    /// Model zoo: `models list`, `models show NAME`.
    Models(cli::models::ModelsArgs),
    /// Per-kernel breakdown of one forward step.
    Step(cli::step::StepArgs),
    /// Predict one kernel, or a CSV of kernels in the shared schema.
    Kernel(cli::kernel::KernelArgs),
    /// Discrete-event serving simulation (TTFT, TPOT, ITL, throughput).
    Simulate(cli::simulate::SimulateArgs),
    /// Simulator speed benchmark.
    Bench(cli::bench::BenchArgs),
    /// Microbenchmark sweep plans for the GPU collector.
    Microbench(cli::microbench::MicrobenchArgs),
    /// Import public measurement tables into the shared schema.
    Import(cli::import::ImportArgs),
    /// Fit efficiency models and write calibration/.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Report prediction error on held-out measurements.
    Validate(cli::validate::ValidateArgs),
    /// Speed-of-light and headroom service for kernel-optimizing agents.
    Sol(cli::sol::SolArgs),
    /// Workload generation: `workload gen [workload flags] --out FILE.csv`.
    Workload(cli::workload::WorkloadCmdArgs),
    /// Capacity planning: cheapest deployment meeting SLOs.
    Plan(cli::plan::PlanArgs),
    /// Highest arrival rate a deployment sustains within SLOs.
    Capacity(cli::capacity::CapacityArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Hw(a) => cli::hw::run(a),
        Command::Models(a) => cli::models::run(a),
        Command::Step(a) => cli::step::run(a),
        Command::Kernel(a) => cli::kernel::run(a),
        Command::Simulate(a) => cli::simulate::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Microbench(a) => cli::microbench::run(a),
        Command::Import(a) => cli::import::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::Validate(a) => cli::validate::run(a),
        Command::Sol(a) => cli::sol::run(a),
        Command::Workload(a) => cli::workload::run(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::Capacity(a) => cli::capacity::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

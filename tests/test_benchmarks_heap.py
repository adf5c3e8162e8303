"""benchmarks/bench_heap_soak.py refuses bad arguments in one line (exit 2) before starting any child."""
from benchmarks import bench_heap_soak


def test_bad_arguments_exit_2_in_one_line(capsys):
    assert bench_heap_soak.main(["--cases", "dynamic,nonsense"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: unknown case 'nonsense' (cases: dynamic, kept, after, after+tidy)"]
    assert bench_heap_soak.main(["--runs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --runs must be >= 1"

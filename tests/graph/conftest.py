"""Graph tests: the ONNX node-conformance tally, printed at the end of the session."""

CONFORMANCE: dict = {}     # case name -> "passed" | "unsupported" | "failed: <reason>"


def pytest_terminal_summary(terminalreporter):
    """Print the ONNX backend node-case pass rate when the conformance tests ran."""
    if not CONFORMANCE:
        return
    results = list(CONFORMANCE.values())
    passed, unsupported = results.count("passed"), results.count("unsupported")
    failed = len(results) - passed - unsupported
    terminalreporter.write_sep("-", "ONNX backend node conformance (cpu target)")
    terminalreporter.write_line(
        f"{len(results)} cases of supported operators: {passed} passed ({passed / len(results):.1%}), "
        f"{unsupported} raised UnsupportedOnnxError (data types, opsets, attribute values not supported), "
        f"{failed} failed; pass rate among the cases not refused: {passed / max(passed + failed, 1):.1%}")

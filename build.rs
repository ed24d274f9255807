fn main() {
    // Emits the `Py_3_x` cfgs for the interpreter being built against.
    pyo3_build_config::use_pyo3_cfgs();
}

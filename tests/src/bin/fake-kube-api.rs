//! The fake Kubernetes API server of the kube inventory tests
//! (`pxe_tests::kube_api`): `fake-kube-api --listen 127.0.0.1:0`.

fn main() {
    pxe_tests::kube_api::main_with_args(std::env::args());
}

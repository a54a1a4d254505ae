// The communication suite (dev/test/test_comm.cu) built with nvcc: NCCL and MPI link, and it runs on one GPU when
// there is one. The CPU build runs the same suite as build/test_comm (dev/test/host_suites.cu).
#include "test_comm.cu"

int main(int argc, char** argv) { return test_comm::run(argc, argv); }

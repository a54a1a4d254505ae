/*
The host-side suites as one program. Each suite is its own file, dev/test/test_<name>.cu, whose code sits in a
namespace of the suite's name with a `run` where a program would have `main`. Most of them include the model's
and the kernels' headers, whose launchers and kernels g++ compiles in every translation unit that includes
them (about 25 s of a 2-core machine each): compiled here as one unit, they are compiled once.

The Makefile links the program under each suite's name (build/test_memory -> host_suites, ...), and the name it
is called by picks the suite, which gets the arguments as its own program would; so every suite keeps its
command, its output and its closing line `N passed, M failed`.
    build/test_NAME [ARGS]          or          build/host_suites test_NAME [ARGS]
*/
#include <cstring>
#include "test_host.cu"
#include "test_flags.cu"
#include "test_data.cu"
#include "test_memory.cu"
#include "test_parameter_layout.cu"
#include "test_planner.cu"
#include "test_cost_model.cu"
#include "test_machine.cu"
#include "test_pipeline.cu"
#include "test_comm.cu"

struct HostSuite {
    const char* name;
    int (*run)(int argc, char** argv);
};
constexpr HostSuite kHostSuites[] = {
    {"test_host", test_host::run},
    {"test_flags", test_flags::run},
    {"test_data", test_data::run},
    {"test_memory", test_memory::run},
    {"test_parameter_layout", test_parameter_layout::run},
    {"test_planner", test_planner::run},
    {"test_cost_model", test_cost_model::run},
    {"test_machine", test_machine::run},
    {"test_pipeline", test_pipeline::run},
    {"test_comm", test_comm::run},
};

int main(int argc, char** argv) {
    const char* slash = strrchr(argv[0], '/');
    std::string name = slash ? slash + 1 : argv[0];
    if (name == "host_suites" && argc > 1) argc--, argv++, name = argv[0];  // build/host_suites test_NAME ARGS
    for (const HostSuite& suite : kHostSuites)
        if (name == suite.name) return suite.run(argc, argv);
    std::string names;
    for (const HostSuite& suite : kHostSuites) names += std::string(" ") + suite.name;
    fprintf(stderr, "error: no host suite named '%s' (the suites:%s)\n", name.c_str(), names.c_str());
    return 2;
}

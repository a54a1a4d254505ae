/*
Tests of llmc/io/flags.h, the flag table that both the parser and --help read, and of train_gpt's table in
llmc/io/options.h: what --help states (defaults, ranges, choices) held against what the parser does. Expected
values are worked out by hand in the comments, not taken from the code under test. Every error path is run in a
forked child whose exit status and message are checked: it must fail, in one line, naming the problem.
Prints `N passed, M failed` and exits non-zero on any failure.
*/
#include <memory>
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/io/flags.h"
#include "../../llmc/io/options.h"
#include "flag_table.h"

namespace test_flags {  // one suite of dev/test/host_suites.cu

// ----------------------------------------------------------------------------
// the parser

void expect_flags_failure(const std::string& name, const std::vector<std::string>& arguments, const std::string& must_contain) {
    expect_failure(name, [&] { TestFlags t; t.parse(arguments); }, must_contain);
}

void test_parser() {
    printf("flags\n");
    {
        TestFlags t;
        t.parse({});
        check_true("defaults when nothing is given", t.batch_size == 4 && t.learning_rate == 3e-4f && !t.resume &&
                                                         t.output_dir == "out" && t.schedule == "cosine" &&
                                                         !t.flags.was_given("batch-size"));
    }
    {
        TestFlags t;
        t.parse({"--batch-size", "8", "--learning-rate=1e-3", "--resume", "--output-dir", "/tmp/run 1",
                 "--lr-schedule=constant", "--shift", "-3", "--dropout", "1"});
        check_true("--name value, --name=value, bare bool, negative number",
                   t.batch_size == 8 && t.learning_rate == 1e-3f && t.resume && t.output_dir == "/tmp/run 1" &&
                       t.schedule == "constant" && t.shift == -3 && t.dropout == 1.0f &&
                       t.flags.was_given("batch-size") && t.flags.was_given("shift"));
    }
    {
        TestFlags a, b, c, d;
        a.parse({"--resume=false"});
        b.parse({"--resume", "true", "--batch-size", "2"});
        c.parse({"--resume", "--batch-size", "2"});
        d.parse({"--resume=0", "--output-dir=--odd=name"});
        check_true("bool spellings: =false, then true, bare before another flag, =0",
                   !a.resume && b.resume && b.batch_size == 2 && c.resume && c.batch_size == 2 && !d.resume);
        check_true("a value starting with -- is taken with =, including further = signs", d.output_dir == "--odd=name");
    }

    expect_flags_failure("unknown flag suggests the closest name", {"--batch-sise", "3"},
                         "unknown flag --batch-sise (did you mean --batch-size?)");
    expect_flags_failure("unknown flag far from all names points to --help", {"--zzzzzz"},
                         "unknown flag --zzzzzz (see --help");
    expect_flags_failure("missing value at the end", {"--batch-size"}, "flag --batch-size needs a value (an integer)");
    expect_flags_failure("missing value before the next flag", {"--output-dir", "--resume"},
                         "flag --output-dir needs a value");
    expect_flags_failure("integer that does not parse", {"--batch-size", "abc"},
                         "flag --batch-size expects an integer, got 'abc'");
    expect_flags_failure("integer with trailing junk", {"--batch-size=4x"}, "expects an integer, got '4x'");
    expect_flags_failure("empty value with =", {"--batch-size="}, "expects an integer, got ''");
    expect_flags_failure("number that does not parse", {"--learning-rate", "fast"},
                         "flag --learning-rate expects a finite number, got 'fast'");
    expect_flags_failure("NaN is not a learning rate", {"--learning-rate", "nan"}, "expects a finite number");
    expect_flags_failure("below the minimum names the range", {"--batch-size", "0"},
                         "flag --batch-size must be between 1 and 1024, got 0");
    expect_flags_failure("float minimum only", {"--learning-rate", "-1"},
                         "flag --learning-rate must be at least 0, got -1");
    expect_flags_failure("float above the maximum", {"--dropout", "1.5"}, "must be between 0 and 1, got 1.5");
    expect_flags_failure("integer overflow", {"--shift", "99999999999"}, "flag --shift must be a 32-bit integer");
    expect_flags_failure("invalid choice lists the choices", {"--lr-schedule", "linear"},
                         "flag --lr-schedule must be one of cosine, constant; got 'linear'");
    expect_flags_failure("flag given twice", {"--batch-size", "2", "--batch-size=3"}, "flag --batch-size given twice");
    expect_flags_failure("bool with a bad value", {"--resume=maybe"}, "flag --resume expects true or false, got 'maybe'");
    expect_flags_failure("stray argument", {"--batch-size", "2", "3"}, "unexpected argument '3'");
    expect_flags_failure("single-dash flag", {"-b", "2"}, "unexpected argument '-b'");
    {
        // an integer that also takes a word (train_gpt's --checkpoint-every auto): the word's value -1 lies below
        // the range, so no number can mean it
        auto parse_every = [](std::vector<std::string> arguments) {
            auto flags = std::make_unique<Flags>("x", "y");
            flags->add_int_or_word("every", 0, "auto", -1, "steps between saves", 0);
            arguments.insert(arguments.begin(), "x");
            std::vector<char*> argv;
            for (std::string& a : arguments) argv.push_back(a.data());
            flags->parse((int)argv.size(), argv.data());
            return flags;
        };
        auto word = parse_every({"--every", "auto"}), number = parse_every({"--every=7"}), fallback = parse_every({});
        check_true("an integer or a word: the word's value, as text in the JSON; a number as a number",
                   word->exact_value("every") == "auto" && word->to_json() == "{\"every\": \"auto\"}" &&
                       number->exact_value("every") == "7" && number->to_json() == "{\"every\": 7}" &&
                       fallback->to_json() == "{\"every\": 0}",
                   word->to_json() + " " + number->to_json() + " " + fallback->to_json());
        auto [status, help] = run_in_child([&] { parse_every({"--help"}); });
        const bool shown = status == 0 && contains(help, "--every INT|auto");
        check_true("an integer or a word: --help shows INT|auto", shown, shown ? "" : help);
        expect_failure("an integer or a word: another word", [&] { parse_every({"--every", "often"}); },
                       "flag --every expects an integer or auto, got 'often'");
        expect_failure("an integer or a word: the word's value as a number", [&] { parse_every({"--every", "-1"}); },
                       "flag --every must be at least 0 or auto, got -1");
        expect_failure("a word whose value the range accepts is a programming error",
                       [] { Flags f("x", "y"); f.add_int_or_word("n", 0, "auto", 3, ".", 0); }, "is a number the flag accepts");
    }
    expect_failure("default outside the choices is a programming error",
                   [] { Flags f("x", "y"); f.add_choice("mode", "c", {"a", "b"}, "..."); }, "default 'c'");
    expect_failure("a flag declared twice is a programming error",
                   [] { Flags f("x", "y"); f.add_int("n", 1, "."); f.add_float("n", 1, "."); }, "declared twice");

    // --help: exit 0 and every row of the table in the text, with its default, range and choices
    for (const char* help : {"--help", "-h"}) {
        // the other arguments (one of them wrong) must not matter: help shows the defaults and exits
        auto [status, text] = run_in_child([&] { TestFlags t; t.parse({"--batch-size", "2", "--bogus", help}); });
        bool all = status == 0 && contains(text, "Usage: train_gpt") && contains(text, "Trains GPT-2 on token shards.");
        for (const char* part : {"Model and data:", "Optimizer:", "--batch-size INT", "sequences per micro-batch",
                                 "(default: 4; between 1 and 1024)", "--shift INT", "(default: 0)",
                                 "--learning-rate NUMBER", "(default: 0.0003; at least 0)",
                                 "--resume[=true|false]", "--output-dir TEXT", "--lr-schedule cosine|constant",
                                 "(default: cosine)", "--help, -h"})
            all = all && contains(text, part);
        check_true(std::string(help) + " prints every flag from the table and exits 0", all,
                   all ? "" : "exit " + std::to_string(status) + ":\n" + text);
    }

    TestFlags t;
    t.parse({"--output-dir", "a \"quoted\"\\path", "--batch-size", "16"});
    std::string json = t.flags.to_json();
    std::string expected_json =
        "{\"batch-size\": 16, \"shift\": 0, \"learning-rate\": 0.0003, \"dropout\": 0, \"resume\": false, "
        "\"output-dir\": \"a \\\"quoted\\\"\\\\path\", \"lr-schedule\": \"cosine\"}";
    check_true("to_json: numbers bare, strings quoted and escaped", json == expected_json, json);
    std::string summary = t.flags.summary();
    check_true("summary has one aligned line per flag",
               contains(summary, "  batch-size     16\n") && contains(summary, "  lr-schedule    cosine\n") &&
                   std::count(summary.begin(), summary.end(), '\n') == 7,
               "\n" + summary);
    std::string command = t.flags.command_line();
    check_true("command_line reproduces the values",
               contains(command, "train_gpt --batch-size 16 --shift 0") &&
                   contains(command, "--output-dir=\"a \\\"quoted\\\"\\\\path\""),
               command);
    check_true("json_quote escapes control characters", json_quote("a\nb\x01") == "\"a\\nb\\u0001\"");
}

// ----------------------------------------------------------------------------
// train_gpt's flags: what --help states, held against what the parser does

// One flag's row of --help: "  --name USAGE  help (default: D; range)".
struct HelpRow {
    std::string name, usage, help, default_text, range;
};

std::vector<HelpRow> help_rows(const std::string& help) {
    std::vector<HelpRow> rows;
    size_t start = 0;
    while (start < help.size()) {
        size_t end = help.find('\n', start);
        if (end == std::string::npos) end = help.size();
        const std::string line = help.substr(start, end - start);
        start = end + 1;
        const size_t opened = line.rfind(" (default: ");
        if (line.rfind("  --", 0) != 0 || opened == std::string::npos || line.back() != ')') continue;
        HelpRow row;
        const size_t name_end = line.find_first_of(" [", 4), usage_end = line.find("  ", 4);
        row.name = line.substr(4, name_end - 4);
        row.usage = line.substr(2, usage_end - 2);
        row.help = line.substr(line.find_first_not_of(' ', usage_end), opened - line.find_first_not_of(' ', usage_end));
        std::string stated = line.substr(opened + 11, line.size() - 1 - (opened + 11));
        const size_t semicolon = stated.find("; ");
        row.default_text = stated.substr(0, semicolon);
        if (semicolon != std::string::npos) row.range = stated.substr(semicolon + 2);
        rows.push_back(row);
    }
    return rows;
}

// train_gpt's table with `arguments` parsed (on bad input the parser ends the process, as in the program)
void parse_train_gpt(Flags& flags, std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "train_gpt");
    std::vector<char*> argv;
    for (std::string& a : arguments) argv.push_back(a.data());
    parse_options(flags, (int)argv.size(), argv.data());
}

// Whether the parser refuses `--name=value` with its one line; a refusal after parsing (a later check on
// the values together) does not count: the parser took the value.
bool parser_refuses(const std::string& name, const std::string& value) {
    auto [status, output] = run_in_child([&] { Flags flags("train_gpt", ""); parse_train_gpt(flags, {"--" + name + "=" + value}); });
    return status != 0 && contains(output, "error: flag --" + name + " ");
}

// Every row of train_gpt's --help: its default parses back to the parser's default exactly; a number's default
// has no more digits than reading it back needs; each end of a stated range is accepted and the value just
// past it refused; each listed choice is accepted and another refused; a "0: ..." meaning is accepted.
void test_train_gpt_help() {
    printf("train_gpt's --help against its parser\n");
    auto [status, help] = run_in_child([] {
        std::string program = "train_gpt", flag = "--help";
        char* argv[] = {program.data(), flag.data()};
        parse_options(2, argv);
    });
    Flags defaults("train_gpt", "");
    parse_train_gpt(defaults, {});
    const std::vector<HelpRow> rows = help_rows(help);
    std::vector<std::string> listed;
    for (const HelpRow& row : rows) listed.push_back(row.name);
    check_true("--help exits 0 and has one row per flag of the table, in order", status == 0 && listed == defaults.names(),
               std::to_string(rows.size()) + " rows, " + std::to_string(defaults.names().size()) + " flags");
    check_true("--help says what it trains", contains(help, "GPT-2 or Llama 3") && contains(help, "mixture of experts") &&
                                                 !contains(help, "Trains GPT-2 on"));

    std::string wrong_default, long_number, wrong_range, wrong_choice, wrong_zero;
    for (const HelpRow& row : rows) {
        const bool is_int = contains(row.usage, " INT"), is_number = contains(row.usage, " NUMBER");
        auto [reread_status, reread] = run_in_child([&] {  // (a default the parser refuses ends the child)
            Flags flags("train_gpt", "");
            parse_train_gpt(flags, {"--" + row.name + "=" + row.default_text});
            printf("%s", flags.exact_value(row.name).c_str());
        });
        if (reread_status != 0 || reread != defaults.exact_value(row.name))
            wrong_default += " --" + row.name + " states " + row.default_text + ", holds " +
                             defaults.exact_value(row.name) + ", reads back " + reread;
        if (is_number) {  // written with the fewest significant digits: one fewer reads back another float
            const float value = strtof(row.default_text.c_str(), nullptr);
            int digits = 0;
            bool leading = true;
            for (char c : row.default_text.substr(0, row.default_text.find('e'))) {
                if (!isdigit((unsigned char)c)) continue;
                if (c != '0') leading = false;
                if (!leading) digits++;
            }
            char shorter[64];
            snprintf(shorter, sizeof(shorter), "%.*g", std::clamp(digits - 1, 1, 17), value);
            const bool whole = value == std::floor(value);  // whole numbers are written out in full
            if (digits > 1 && !whole && strtof(shorter, nullptr) == value)
                long_number += " --" + row.name + " " + row.default_text + " (" + shorter + " reads back the same)";
        }
        if (!row.range.empty()) {
            // "between A and B", "at least A", "at most B"
            std::string low, high;
            if (row.range.rfind("between ", 0) == 0) {
                const size_t and_at = row.range.find(" and ");
                low = row.range.substr(8, and_at - 8), high = row.range.substr(and_at + 5);
            } else if (row.range.rfind("at least ", 0) == 0) {
                low = row.range.substr(9);
            } else if (row.range.rfind("at most ", 0) == 0) {
                high = row.range.substr(8);
            } else {
                wrong_range += " --" + row.name + " states an unknown range '" + row.range + "'";
                continue;
            }
            for (const bool is_low : {true, false}) {
                const std::string& bound = is_low ? low : high;
                if (bound.empty()) continue;
                std::string outside;
                if (is_int) {
                    outside = std::to_string(strtoll(bound.c_str(), nullptr, 10) + (is_low ? -1 : 1));
                } else {
                    char text[64];
                    snprintf(text, sizeof(text), "%.9g", std::nextafter(strtof(bound.c_str(), nullptr),
                                                                        is_low ? -INFINITY : INFINITY));
                    outside = text;
                }
                if (parser_refuses(row.name, bound)) wrong_range += " --" + row.name + " refuses " + bound;
                if (!parser_refuses(row.name, outside)) wrong_range += " --" + row.name + " accepts " + outside;
            }
        }
        const size_t space = row.usage.find(' ');
        if (!is_int && !is_number && space != std::string::npos && row.usage.find(" TEXT") == std::string::npos) {
            std::string choices = row.usage.substr(space + 1) + "|";  // "a|b|c|"
            for (size_t at = 0, bar; (bar = choices.find('|', at)) != std::string::npos; at = bar + 1)
                if (parser_refuses(row.name, choices.substr(at, bar - at)))
                    wrong_choice += " --" + row.name + " refuses " + choices.substr(at, bar - at);
            if (!parser_refuses(row.name, "no-such-choice")) wrong_choice += " --" + row.name + " accepts no-such-choice";
        }
        if ((is_int || is_number) && (contains(row.help, "(0:") || contains(row.help, "; 0:")) &&
            parser_refuses(row.name, "0"))
            wrong_zero += " --" + row.name;
    }
    check_true("every stated default reads back as the parser's default", wrong_default.empty(), wrong_default);
    check_true("number defaults as written: 0.01, 0.0003, 0.9, 1e-8, 500000, no digit too many",
               long_number.empty() && contains(help, "(default: 0.01;") && contains(help, "(default: 0.0003;") &&
                   contains(help, "(default: 0.9;") && contains(help, "(default: 1e-8;") &&
                   contains(help, "(default: 500000;"),
               long_number);
    check_true("every stated range: both ends accepted, the value just past each refused", wrong_range.empty(),
               wrong_range);
    check_true("every listed choice accepted, another refused", wrong_choice.empty(), wrong_choice);
    check_true("every flag whose help gives 0 a meaning accepts 0", wrong_zero.empty(), wrong_zero);
}

int run(int, char**) {
    test_parser();
    test_train_gpt_help();
    return lab_closing_line();
}
}  // namespace test_flags

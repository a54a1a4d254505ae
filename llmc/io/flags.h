/*
Command-line flags, long-form only, declared once in one table.

The parser and the --help text both read the same table, so the help can never disagree with what is
accepted. Each add_*() call appends a row (name, type, default, help text, allowed values) and returns a
reference to the value, which parse() then overwrites:

    Flags flags("train_gpt", "Trains a model on token shards.");
    flags.heading("Model and data");                                      // optional help sections
    int& batch_size = flags.add_int("batch-size", 4, "sequences per micro-batch", 1);       // min 1
    float& lr = flags.add_float("learning-rate", 3e-4f, "peak learning rate", 0.0f);        // min 0
    std::string& out = flags.add_string("output-dir", "out", "where logs and checkpoints go");
    bool& resume = flags.add_bool("resume", false, "continue from the latest checkpoint");
    std::string& schedule = flags.add_choice("lr-schedule", "cosine", {"cosine", "constant"}, "...");
    flags.parse(argc, argv);          // on --help or -h: prints the help and exits with status 0
    printf("%s", flags.summary().c_str());                                 // every value, one per line
    flags.was_given("resume");        // true if it appeared on the command line

Accepted spellings: `--name value` and `--name=value`. A boolean flag alone means true; it also takes
`--name=true|false` (or 1/0, yes/no), and `--name true|false` with the value as the next argument.
A value that itself starts with "--" must use the `=` form. Negative numbers work either way.
Every mistake ends the program with one line naming the flag: an unknown flag (with the closest known
name), a missing value, a value that does not parse, a value out of range (with the range), a choice not
in the list (with the list), a flag given twice, and a stray argument that is not a flag.

The reference returned by add_*() stays valid for the lifetime of the Flags object (each row is heap
allocated, so later add_*() calls never move it).

json_quote() is also used by llmc/io/logger.h, which writes the flags into the run's log file.
*/
#pragma once

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include "../utils.h"

// A string as a JSON string literal: quotes, backslashes and control characters escaped.
inline std::string json_quote(const std::string& text) {
    std::string quoted = "\"";
    for (unsigned char c : text) {
        if (c == '"') quoted += "\\\"";
        else if (c == '\\') quoted += "\\\\";
        else if (c == '\n') quoted += "\\n";
        else if (c == '\t') quoted += "\\t";
        else if (c == '\r') quoted += "\\r";
        else if (c < 0x20) {
            char escape[8];
            snprintf(escape, sizeof(escape), "\\u%04x", c);
            quoted += escape;
        } else quoted += (char)c;
    }
    return quoted + "\"";
}

class Flags {
public:
    Flags(std::string program, std::string description)
        : program_(std::move(program)), description_(std::move(description)) {}

    // Later flags are listed under this heading in --help.
    void heading(const std::string& title) { current_heading_ = title; }

    int& add_int(const std::string& name, int default_value, const std::string& help, int min = INT_MIN,
                 int max = INT_MAX) {
        Flag& flag = add(name, kInt, help);
        flag.int_value = default_value;
        flag.int_min = min;
        flag.int_max = max;
        return flag.int_value;
    }
    // An integer flag that also takes one word in place of a number ("--checkpoint-every auto"): the word sets the
    // value to `word_value`, which lies outside [min, max] so that no number can mean the word.
    int& add_int_or_word(const std::string& name, int default_value, const std::string& word, int word_value,
                         const std::string& help, int min = INT_MIN, int max = INT_MAX) {
        if (word_value >= min && word_value <= max)
            fatal("flag --%s: the value %d of '%s' is a number the flag accepts", name.c_str(), word_value, word.c_str());
        int& value = add_int(name, default_value, help, min, max);
        flags_.back()->word = word, flags_.back()->word_value = word_value;
        return value;
    }
    float& add_float(const std::string& name, float default_value, const std::string& help,
                     float min = -INFINITY, float max = INFINITY) {
        Flag& flag = add(name, kFloat, help);
        flag.float_value = default_value;
        flag.float_min = min;
        flag.float_max = max;
        return flag.float_value;
    }
    bool& add_bool(const std::string& name, bool default_value, const std::string& help) {
        Flag& flag = add(name, kBool, help);
        flag.bool_value = default_value;
        return flag.bool_value;
    }
    std::string& add_string(const std::string& name, const std::string& default_value, const std::string& help) {
        Flag& flag = add(name, kString, help);
        flag.string_value = default_value;
        return flag.string_value;
    }
    std::string& add_choice(const std::string& name, const std::string& default_value,
                            const std::vector<std::string>& choices, const std::string& help) {
        Flag& flag = add(name, kChoice, help);
        flag.string_value = default_value;
        flag.choices = choices;
        bool known = false;
        for (const std::string& choice : choices) known = known || choice == default_value;
        if (!known) fatal("flag --%s: default '%s' is not one of its choices", name.c_str(), default_value.c_str());
        return flag.string_value;
    }

    void parse(int argc, char** argv) {
        // help first, so that it shows the defaults and works even when other arguments are wrong
        for (int i = 1; i < argc; i++) {
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                print_help(stdout);
                exit(EXIT_SUCCESS);
            }
        }
        for (int i = 1; i < argc; i++) {
            std::string argument = argv[i];
            if (argument.rfind("--", 0) != 0 || argument.size() == 2) {
                fatal("unexpected argument '%s' (flags are long-form: --name value; see --help)", argument.c_str());
            }
            std::string name = argument.substr(2), value;
            bool has_value = false;
            size_t equals = name.find('=');
            if (equals != std::string::npos) {
                value = name.substr(equals + 1);
                name = name.substr(0, equals);
                has_value = true;
            }
            Flag* flag = find(name);
            if (!flag) fatal("unknown flag --%s%s", name.c_str(), suggestion_for(name).c_str());
            if (flag->given) fatal("flag --%s given twice", name.c_str());
            flag->given = true;
            if (!has_value) {
                bool next_is_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
                if (flag->type == kBool) {
                    // a bare boolean flag means true; only an explicit true/false after it is its value
                    bool dummy;
                    if (i + 1 < argc && parse_bool(argv[i + 1], &dummy)) value = argv[++i];
                    else value = "true";
                } else if (next_is_value) {
                    value = argv[++i];
                } else {
                    fatal("flag --%s needs a value (%s)", name.c_str(), placeholder(*flag).c_str());
                }
            }
            set(*flag, value);
        }
    }

    bool was_given(const std::string& name) const {
        const Flag* flag = find(name);
        if (!flag) fatal("was_given: no flag named --%s", name.c_str());
        return flag->given;
    }

    // Every flag's name, in the table's order.
    std::vector<std::string> names() const {
        std::vector<std::string> list;
        for (const auto& flag : flags_) list.push_back(flag->name);
        return list;
    }

    // A flag's value exactly (a float in hexadecimal), so that two values print alike only when they are
    // equal: what a test compares with the default --help states.
    std::string exact_value(const std::string& name) const {
        const Flag* flag = find(name);
        if (!flag) fatal("exact_value: no flag named --%s", name.c_str());
        char text[64];
        switch (flag->type) {
            case kInt: return value_text(*flag);
            case kFloat: snprintf(text, sizeof(text), "%a", flag->float_value); return text;
            case kBool: return flag->bool_value ? "true" : "false";
            default: return flag->string_value;
        }
    }

    void print_help(FILE* out) const {
        fprintf(out, "Usage: %s [--flag value ...]\n%s\n", program_.c_str(), description_.c_str());
        std::string last_heading = "\x01";  // differs from every real heading, so the first one prints
        size_t width = 0;
        for (const auto& flag : flags_) width = std::max(width, usage(*flag).size());
        for (const auto& flag : flags_) {
            if (flag->heading != last_heading) {
                fprintf(out, "\n%s\n", flag->heading.empty() ? "Options:" : (flag->heading + ":").c_str());
                last_heading = flag->heading;
            }
            fprintf(out, "  %-*s  %s (default: %s%s)\n", (int)width, usage(*flag).c_str(), flag->help.c_str(),
                    value_text(*flag).c_str(), range_text(*flag).c_str());
        }
        fprintf(out, "\n  %-*s  %s\n", (int)width, "--help, -h", "print this help and exit");
    }

    // Every flag and its value, one per line, for the console at startup.
    std::string summary() const {
        size_t width = 0;
        for (const auto& flag : flags_) width = std::max(width, flag->name.size());
        std::string text;
        for (const auto& flag : flags_) {
            char line[1024];
            snprintf(line, sizeof(line), "  %-*s  %s\n", (int)width, flag->name.c_str(), value_text(*flag).c_str());
            text += line;
        }
        return text;
    }

    // Every flag as a command line that reproduces this run ("--batch-size 4 --output-dir out ...").
    std::string command_line() const {
        std::string text = program_;
        for (const auto& flag : flags_) {
            std::string value = value_text(*flag);
            bool plain = !value.empty() && value.find_first_of(" \t\"'\\$") == std::string::npos;
            text += " --" + flag->name + (plain ? " " + value : "=" + json_quote(value));
        }
        return text;
    }

    // Every flag as one JSON object: numbers and booleans as JSON values, strings quoted.
    std::string to_json() const {
        std::string text = "{";
        for (const auto& flag : flags_) {
            if (text.size() > 1) text += ", ";
            bool is_text = flag->type == kString || flag->type == kChoice || is_word(*flag);
            text += json_quote(flag->name) + ": " + (is_text ? json_quote(value_text(*flag)) : value_text(*flag));
        }
        return text + "}";
    }

private:
    enum Type { kInt, kFloat, kBool, kString, kChoice };
    struct Flag {
        std::string name, help, heading;
        Type type;
        bool given = false;
        int int_value = 0, int_min = INT_MIN, int_max = INT_MAX;
        std::string word;  // add_int_or_word: the word that stands for word_value
        int word_value = 0;
        float float_value = 0.0f, float_min = -INFINITY, float_max = INFINITY;
        bool bool_value = false;
        std::string string_value;
        std::vector<std::string> choices;
    };

    std::string program_, description_, current_heading_;
    std::vector<std::unique_ptr<Flag>> flags_;

    Flag& add(const std::string& name, Type type, const std::string& help) {
        if (name.empty() || name[0] == '-' || name.find('=') != std::string::npos)
            fatal("flag name '%s' must be a bare name such as batch-size", name.c_str());
        if (find(name)) fatal("flag --%s is declared twice", name.c_str());
        flags_.push_back(std::make_unique<Flag>());
        Flag& flag = *flags_.back();
        flag.name = name;
        flag.type = type;
        flag.help = help;
        flag.heading = current_heading_;
        return flag;
    }

    Flag* find(const std::string& name) const {
        for (const auto& flag : flags_)
            if (flag->name == name) return flag.get();
        return nullptr;
    }

    static bool parse_bool(const std::string& text, bool* out) {
        if (text == "true" || text == "1" || text == "yes") { *out = true; return true; }
        if (text == "false" || text == "0" || text == "no") { *out = false; return true; }
        return false;
    }

    void set(Flag& flag, const std::string& value) {
        const char* name = flag.name.c_str();
        const char* text = value.c_str();
        switch (flag.type) {
            case kInt: {
                if (!flag.word.empty() && value == flag.word) {
                    flag.int_value = flag.word_value;
                    break;
                }
                char* end = nullptr;
                errno = 0;
                long long parsed = strtoll(text, &end, 10);
                if (value.empty() || *end != '\0')
                    fatal("flag --%s expects an integer%s, got '%s'", name, word_alternative(flag).c_str(), text);
                if (errno == ERANGE || parsed < flag.int_min || parsed > flag.int_max)
                    fatal("flag --%s must be %s%s, got %s", name, range_words(flag).c_str(),
                          word_alternative(flag).c_str(), text);
                flag.int_value = (int)parsed;
                break;
            }
            case kFloat: {
                char* end = nullptr;
                float parsed = strtof(text, &end);
                if (value.empty() || *end != '\0' || !std::isfinite(parsed))
                    fatal("flag --%s expects a finite number, got '%s'", name, text);
                if (parsed < flag.float_min || parsed > flag.float_max)
                    fatal("flag --%s must be %s, got %s", name, range_words(flag).c_str(), text);
                flag.float_value = parsed;
                break;
            }
            case kBool:
                if (!parse_bool(value, &flag.bool_value))
                    fatal("flag --%s expects true or false, got '%s'", name, text);
                break;
            case kString:
                flag.string_value = value;
                break;
            case kChoice: {
                for (const std::string& choice : flag.choices) {
                    if (choice == value) {
                        flag.string_value = value;
                        return;
                    }
                }
                fatal("flag --%s must be one of %s; got '%s'", name, join(flag.choices, ", ").c_str(), text);
            }
        }
    }

    // " (did you mean --batch-size?)" when some flag is a few edits away from what was typed
    std::string suggestion_for(const std::string& typed) const {
        // beyond about a third of the word a "suggestion" is a random flag, which misleads more than helps
        const size_t farthest = std::max<size_t>(2, typed.size() / 3);
        const Flag* best = nullptr;
        size_t best_distance = SIZE_MAX;
        for (const auto& flag : flags_) {
            // the distance is at least the difference in length, so names too far off are skipped: a long
            // mistyped argument then costs no edit distances (a 128 KiB one cost 0.2 s)
            const size_t shorter = std::min(typed.size(), flag->name.size());
            if (std::max(typed.size(), flag->name.size()) - shorter > farthest) continue;
            size_t distance = edit_distance(typed, flag->name);
            if (distance < best_distance) best_distance = distance, best = flag.get();
        }
        if (best && best_distance <= farthest)
            return " (did you mean --" + best->name + "?)";
        return " (see --help for the list of flags)";
    }

    // Levenshtein distance: insertions, deletions and substitutions each cost 1.
    static size_t edit_distance(const std::string& a, const std::string& b) {
        std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
        for (size_t j = 0; j <= b.size(); j++) previous[j] = j;
        for (size_t i = 1; i <= a.size(); i++) {
            current[0] = i;
            for (size_t j = 1; j <= b.size(); j++) {
                size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
                current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
            }
            std::swap(previous, current);
        }
        return previous[b.size()];
    }

    static std::string join(const std::vector<std::string>& parts, const std::string& separator) {
        std::string text;
        for (size_t i = 0; i < parts.size(); i++) text += (i ? separator : "") + parts[i];
        return text;
    }

    static std::string number_text(float value) { return shortest_number_text(value, 1e15); }

    static bool is_word(const Flag& flag) {
        return flag.type == kInt && !flag.word.empty() && flag.int_value == flag.word_value;
    }
    static std::string word_alternative(const Flag& flag) { return flag.word.empty() ? "" : " or " + flag.word; }

    static std::string value_text(const Flag& flag) {
        switch (flag.type) {
            case kInt: return is_word(flag) ? flag.word : std::to_string(flag.int_value);
            case kFloat: return number_text(flag.float_value);
            case kBool: return flag.bool_value ? "true" : "false";
            default: return flag.string_value;
        }
    }

    // the allowed range in words: "at least 1", "at most 8", "between 0 and 1"
    static std::string range_words(const Flag& flag) {
        bool has_min, has_max;
        std::string min, max;
        if (flag.type == kInt) {
            has_min = flag.int_min != INT_MIN, has_max = flag.int_max != INT_MAX;
            min = std::to_string(flag.int_min), max = std::to_string(flag.int_max);
        } else if (flag.type == kFloat) {
            has_min = flag.float_min != -INFINITY, has_max = flag.float_max != INFINITY;
            min = number_text(flag.float_min), max = number_text(flag.float_max);
        } else {
            return "";
        }
        if (has_min && has_max) return "between " + min + " and " + max;
        if (has_min) return "at least " + min;
        if (has_max) return "at most " + max;
        return flag.type == kInt ? "a 32-bit integer" : "";
    }

    static std::string range_text(const Flag& flag) {
        std::string words = range_words(flag);
        return words.empty() || words == "a 32-bit integer" ? "" : "; " + words;
    }

    static std::string placeholder(const Flag& flag) {
        switch (flag.type) {
            case kInt: return "an integer" + word_alternative(flag);
            case kFloat: return "a number";
            case kBool: return "true or false";
            case kString: return "a string";
            case kChoice: return "one of " + join(flag.choices, ", ");
        }
        return "";
    }

    static std::string usage(const Flag& flag) {
        switch (flag.type) {
            case kInt: return "--" + flag.name + " INT" + (flag.word.empty() ? "" : "|" + flag.word);
            case kFloat: return "--" + flag.name + " NUMBER";
            case kBool: return "--" + flag.name + "[=true|false]";
            case kString: return "--" + flag.name + " TEXT";
            case kChoice: return "--" + flag.name + " " + join(flag.choices, "|");
        }
        return "";
    }
};

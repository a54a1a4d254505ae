/*
Checkpoints: one file of named sections, written atomically, read back with every byte validated.

Writing:
    CheckpointWriter writer(checkpoint_path(output_dir, step));   // opens "<path>.tmp"
    writer.add("params", host_params, params_bytes);                // streamed to disk at once, so one
    writer.add("adamw_m", host_m, m_bytes);                         //   staging buffer can be reused
    writer.add_value("step", step);                                 // any trivially copyable value
    writer.commit();                                                // fsync, rename over <path>, fsync dir
    remove_old_checkpoints(output_dir, 3);                          // optional: keep the newest 3
Reading:
    long long step = latest_checkpoint_step(output_dir);            // -1 when there is none
    CheckpointReader reader(checkpoint_path(output_dir, step));     // validates header and table
    reader.read("params", host_params, params_bytes);               // size and checksum checked
    int saved_step = reader.read_value<int>("step");
Every problem (missing file, wrong magic or version, truncation, corrupted bytes, a missing section, a size
that differs from what the caller expects) ends the program with one line naming the file and section.

Why atomic: a run can be killed at any moment (preemption, out of memory, ctrl-c). The writer fills
"<path>.tmp" in the same directory, forces it to disk (fsync), and only then renames it over <path>.
rename() within one file system replaces the name in one step, so <path> is always either the complete
old checkpoint or the complete new one; fsync of the directory then makes the rename itself durable.
A leftover .tmp from a killed run is ignored by the readers and overwritten by the next writer.

File layout (little-endian):
    header, 32 bytes:  char magic[8] = "LLMCCKPT", uint32 version = 1, uint32 section_count,
                       uint64 table_offset, uint64 table_checksum (FNV-1a 64 of the table's bytes)
    section data, back to back, in the order they were added
    table at table_offset: section_count entries of 72 bytes:
                       char name[48] (NUL-padded), uint64 offset, uint64 bytes, uint64 checksum (of the data)
    the file ends exactly at the end of the table (anything else means truncation or trailing garbage)
The table goes last because each entry's checksum is known only after its data has been written; the
writer then seeks back and fills in the header.

Checksum: FNV-1a 64 (hash = (hash ^ byte) * 1099511628211, starting from 14695981039346656037). Not
cryptographic, but any single flipped byte changes it, and it is a few lines anyone can check.
Section checksums are verified when a section is read (the data passes through memory anyway), so
opening a large checkpoint costs nothing until its sections are used; verify_all() checks everything.
*/
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include "../utils.h"

constexpr char kCheckpointMagic[8] = {'L', 'L', 'M', 'C', 'C', 'K', 'P', 'T'};
constexpr uint32_t kCheckpointVersion = 1;
constexpr size_t kCheckpointNameBytes = 48;  // a section name is at most 47 characters

struct CheckpointHeader {
    char magic[8];
    uint32_t version;
    uint32_t section_count;
    uint64_t table_offset;
    uint64_t table_checksum;
};
struct CheckpointSection {
    char name[kCheckpointNameBytes];
    uint64_t offset;
    uint64_t bytes;
    uint64_t checksum;
};
static_assert(sizeof(CheckpointHeader) == 32 && sizeof(CheckpointSection) == 72, "layout is part of the format");

// FNV-1a 64, continued from `hash` so that data can be hashed in pieces.
constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ull;
inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnvOffsetBasis) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; i++) hash = (hash ^ p[i]) * 1099511628211ull;
    return hash;
}

class CheckpointWriter {
public:
    explicit CheckpointWriter(const std::string& path) : path_(path), temp_path_(path + ".tmp") {
        file_ = open_file(temp_path_, "wb");
        CheckpointHeader placeholder = {};  // rewritten by commit(); a killed run leaves no valid header
        write_exact(&placeholder, sizeof(placeholder), 1, file_, temp_path_);
        offset_ = sizeof(placeholder);
    }
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;
    ~CheckpointWriter() {
        if (file_) fclose(file_);  // not committed: the .tmp stays behind, the previous checkpoint is untouched
    }

    void add(const std::string& name, const void* data, size_t bytes) {
        if (!file_) fatal("checkpoint %s: add('%s') after commit", path_.c_str(), name.c_str());
        if (name.empty() || name.size() >= kCheckpointNameBytes)
            fatal("checkpoint section name '%s' must have 1 to %zu characters", name.c_str(), kCheckpointNameBytes - 1);
        for (const CheckpointSection& s : sections_)
            if (name == s.name) fatal("checkpoint %s: section '%s' added twice", path_.c_str(), name.c_str());
        CheckpointSection section = {};
        memcpy(section.name, name.data(), name.size());
        section.offset = offset_;
        section.bytes = bytes;
        section.checksum = fnv1a64(data, bytes);
        if (bytes) write_exact(data, 1, bytes, file_, temp_path_);
        offset_ += bytes;
        sections_.push_back(section);
    }

    template <class T>
    void add_value(const std::string& name, const T& value) {
        static_assert(std::is_trivially_copyable<T>::value, "add_value stores the bytes of the value");
        add(name, &value, sizeof(T));
    }

    void commit() {
        if (!file_) fatal("checkpoint %s: committed twice", path_.c_str());
        CheckpointHeader header = {};
        memcpy(header.magic, kCheckpointMagic, sizeof(header.magic));
        header.version = kCheckpointVersion;
        header.section_count = (uint32_t)sections_.size();
        header.table_offset = offset_;
        header.table_checksum = fnv1a64(sections_.data(), sections_.size() * sizeof(CheckpointSection));
        write_exact(sections_.data(), sizeof(CheckpointSection), sections_.size(), file_, temp_path_);
        if (fseek(file_, 0, SEEK_SET) != 0) fatal("cannot seek in %s: %s", temp_path_.c_str(), strerror(errno));
        write_exact(&header, sizeof(header), 1, file_, temp_path_);
        // the data must be on disk before the rename makes it visible, or a power cut could expose a
        // renamed file whose blocks were never written
        if (fflush(file_) != 0 || fsync(fileno(file_)) != 0)
            fatal("cannot flush %s to disk: %s", temp_path_.c_str(), strerror(errno));
        close_file(file_, temp_path_);
        file_ = nullptr;
        if (rename(temp_path_.c_str(), path_.c_str()) != 0)
            fatal("cannot rename %s to %s: %s", temp_path_.c_str(), path_.c_str(), strerror(errno));
        sync_directory_of(path_);
    }

private:
    std::string path_, temp_path_;
    FILE* file_ = nullptr;
    uint64_t offset_ = 0;
    std::vector<CheckpointSection> sections_;

    // The rename is an entry in the directory: fsync the directory so that it survives a power cut.
    static void sync_directory_of(const std::string& path) {
        size_t slash = path.find_last_of('/');
        std::string directory = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
        int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY);
        if (fd < 0) fatal("cannot open directory %s: %s", directory.c_str(), strerror(errno));
        if (fsync(fd) != 0) fatal("cannot sync directory %s: %s", directory.c_str(), strerror(errno));
        close(fd);
    }
};

class CheckpointReader {
public:
    explicit CheckpointReader(const std::string& path) : path_(path) {
        const char* p = path.c_str();
        if (!file_exists(path)) fatal("checkpoint %s does not exist", p);
        size_t size = file_size(path);
        file_ = open_file(path, "rb");
        CheckpointHeader header;
        if (size < sizeof(header)) fatal("checkpoint %s is truncated: %zu bytes, smaller than its header", p, size);
        read_exact(&header, sizeof(header), 1, file_, path, "checkpoint header");
        if (memcmp(header.magic, kCheckpointMagic, sizeof(header.magic)) != 0)
            fatal("%s is not a checkpoint (bad magic number)", p);
        if (header.version != kCheckpointVersion)
            fatal("checkpoint %s has version %u; this program reads version %u", p, header.version, kCheckpointVersion);
        uint64_t table_bytes = (uint64_t)header.section_count * sizeof(CheckpointSection);
        if (header.table_offset < sizeof(header) || header.table_offset > size || size - header.table_offset != table_bytes)
            fatal("checkpoint %s is truncated or damaged: %zu bytes, but its header describes %llu", p, size,
                  (unsigned long long)(header.table_offset + table_bytes));
        sections_.resize(header.section_count);
        if (fseeko(file_, (off_t)header.table_offset, SEEK_SET) != 0) fatal("cannot seek in %s: %s", p, strerror(errno));
        read_exact(sections_.data(), sizeof(CheckpointSection), sections_.size(), file_, path, "section table");
        if (fnv1a64(sections_.data(), table_bytes) != header.table_checksum)
            fatal("checkpoint %s is corrupted: its section table fails its checksum", p);
        for (const CheckpointSection& s : sections_) {
            // the table checksum passed, so these only fail for a file written by something else
            if (s.name[kCheckpointNameBytes - 1] != '\0' || s.offset < sizeof(header) ||
                s.offset > header.table_offset || s.bytes > header.table_offset - s.offset)
                fatal("checkpoint %s has a malformed section table", p);
        }
    }
    CheckpointReader(const CheckpointReader&) = delete;
    CheckpointReader& operator=(const CheckpointReader&) = delete;
    ~CheckpointReader() {
        if (file_) fclose(file_);
    }

    bool has(const std::string& name) const { return lookup(name) != nullptr; }

    // The stored size of a section, to size a buffer before read().
    size_t bytes(const std::string& name) const { return section(name).bytes; }

    std::vector<std::string> section_names() const {
        std::vector<std::string> names;
        for (const CheckpointSection& s : sections_) names.push_back(s.name);
        return names;
    }

    // Copies section `name` into dest, which holds expected_bytes; the stored size must be exactly that.
    void read(const std::string& name, void* dest, size_t expected_bytes) {
        const CheckpointSection& s = section(name);
        if (s.bytes != expected_bytes)
            fatal("checkpoint %s: section '%s' holds %llu bytes, expected %zu (saved with a different configuration?)",
                  path_.c_str(), name.c_str(), (unsigned long long)s.bytes, expected_bytes);
        read_checked(s, dest);
    }

    template <class T>
    T read_value(const std::string& name) {
        static_assert(std::is_trivially_copyable<T>::value, "read_value restores the bytes of the value");
        T value;
        read(name, &value, sizeof(T));
        return value;
    }

    // Reads every section once to check its checksum (a fatal error names the first bad one).
    void verify_all() {
        std::vector<char> buffer;
        for (const CheckpointSection& s : sections_) {
            buffer.resize(s.bytes);
            read_checked(s, buffer.data());
        }
    }

private:
    std::string path_;
    FILE* file_ = nullptr;
    std::vector<CheckpointSection> sections_;

    const CheckpointSection* lookup(const std::string& name) const {
        for (const CheckpointSection& s : sections_)
            if (name == s.name) return &s;
        return nullptr;
    }
    const CheckpointSection& section(const std::string& name) const {
        const CheckpointSection* s = lookup(name);
        if (!s) fatal("checkpoint %s has no section '%s'", path_.c_str(), name.c_str());
        return *s;
    }

    void read_checked(const CheckpointSection& s, void* dest) {
        if (fseeko(file_, (off_t)s.offset, SEEK_SET) != 0) fatal("cannot seek in %s: %s", path_.c_str(), strerror(errno));
        std::string what = std::string("section '") + s.name + "'";
        if (s.bytes) read_exact(dest, 1, s.bytes, file_, path_, what.c_str());
        if (fnv1a64(dest, s.bytes) != s.checksum)
            fatal("checkpoint %s is corrupted: section '%s' fails its checksum", path_.c_str(), s.name);
    }
};

// ----------------------------------------------------------------------------
// checkpoints in an output directory: checkpoint_<step>.bin, the newest one has the highest step

inline std::string checkpoint_path(const std::string& directory, long long step) {
    return directory + "/checkpoint_" + std::to_string(step) + ".bin";
}

// Steps of every file named exactly checkpoint_<digits>.bin in the directory, ascending. Temporary files
// (.tmp, left by a killed writer) do not match. A directory that does not exist holds no checkpoints.
inline std::vector<long long> list_checkpoint_steps(const std::string& directory) {
    std::vector<long long> steps;
    DIR* dir = opendir(directory.c_str());
    if (!dir) {
        if (errno == ENOENT) return steps;
        fatal("cannot list directory %s: %s", directory.c_str(), strerror(errno));
    }
    const std::string prefix = "checkpoint_", suffix = ".bin";
    while (struct dirent* entry = readdir(dir)) {
        std::string name = entry->d_name;
        if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
        // only the spelling checkpoint_path() writes (no leading zeros), so that every listed step maps back
        // to its file name
        if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos ||
            (digits.size() > 1 && digits[0] == '0'))
            continue;
        steps.push_back(std::stoll(digits));
    }
    closedir(dir);
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The highest step with a checkpoint in the directory, or -1 when there is none.
inline long long latest_checkpoint_step(const std::string& directory) {
    std::vector<long long> steps = list_checkpoint_steps(directory);
    return steps.empty() ? -1 : steps.back();
}

// Deletes all but the newest `keep_last` checkpoints. Call it after commit(), so that the newest
// checkpoint is complete on disk before any older one goes.
inline void remove_old_checkpoints(const std::string& directory, int keep_last) {
    if (keep_last < 1) fatal("remove_old_checkpoints: keep_last must be at least 1, got %d", keep_last);
    std::vector<long long> steps = list_checkpoint_steps(directory);
    for (size_t i = 0; i + keep_last < steps.size(); i++) {
        std::string path = checkpoint_path(directory, steps[i]);
        if (remove(path.c_str()) != 0) fatal("cannot remove old checkpoint %s: %s", path.c_str(), strerror(errno));
    }
}

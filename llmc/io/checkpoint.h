/*
Checkpoints: one file of named sections, written atomically, read back with every byte validated.

Writing:
    CheckpointWriter writer(checkpoint_path(output_dir, step));   // opens "<path>.tmp"
    writer.add("params", host_params, params_bytes);                // streamed to disk at once, so one
    writer.add("adamw_m", host_m, m_bytes);                         //   staging buffer can be reused
    writer.add_value("step", step);                                 // any trivially copyable value
    writer.commit();                                                // fsync, rename over <path>, fsync dir
    remove_old_checkpoints(output_dir, 3, step);                    // optional: keep the newest 3
Reading:
    long long step = latest_checkpoint_step(output_dir);            // the newest complete one; -1: none
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
        table_checksum_ = header.table_checksum;
        for (size_t i = 0; i < sections_.size(); i++) {
            // the table checksum passed, so these only fail for a file written by something else; a name is
            // printable (it appears in one-line errors) and unique (a reader must not pick one of two)
            const CheckpointSection& s = sections_[i];
            bool printable = s.name[kCheckpointNameBytes - 1] == '\0' && s.name[0] != '\0';
            for (const char* c = s.name; printable && *c; c++) printable = (unsigned char)*c >= 0x20 && *c != 0x7F;
            bool unique = true;
            for (size_t j = 0; j < i; j++) unique = unique && strncmp(s.name, sections_[j].name, kCheckpointNameBytes) != 0;
            if (!printable || !unique || s.offset < sizeof(header) || s.offset > header.table_offset ||
                s.bytes > header.table_offset - s.offset)
                fatal("checkpoint %s has a malformed section table", p);
        }
    }
    CheckpointReader(const CheckpointReader&) = delete;
    CheckpointReader& operator=(const CheckpointReader&) = delete;
    ~CheckpointReader() {
        if (file_) fclose(file_);
    }

    bool has(const std::string& name) const { return lookup(name) != nullptr; }

    // The checksum of the section table: it covers every section's checksum, so it names the file's contents.
    uint64_t table_checksum() const { return table_checksum_; }

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
    uint64_t table_checksum_ = 0;

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
// checkpoints in an output directory
//
// A checkpoint of step s is one main file, checkpoint_<s>.bin, and, for a sharded run, shard files
// checkpoint_<s>.shard<k>.bin (k = 1 .. files-1; which rank's shard is which: shard_file below). So
// that the files of two checkpoints can never be mixed, each file carries two sections:
//     "checkpoint_id"  a 64-bit number drawn when the save began, the same in every file of the checkpoint
//     "step"           s
// and the main file, written last, lists every shard file in "shard_files": its number, the id it carries
// and the checksum of its section table (which covers every section's checksum, so it pins the contents).
//
// "Latest" is the newest COMPLETE checkpoint: a main file and every shard file it lists. A checkpoint whose
// save was interrupted (no main file, or a listed shard file missing) is skipped with one line, and the one
// before it is used. A file that is present but does not belong (another id or step, another table, a
// damaged file) is not an interrupted save but a mix-up or damage: the run stops with one line naming it.
//
// Old checkpoints are removed only after the new main file is committed, and the main file of an old
// checkpoint before its shard files: at every moment the directory holds at least one complete checkpoint.

struct ShardFileEntry {
    uint64_t file;            // k of checkpoint_<s>.shard<k>.bin
    uint64_t checkpoint_id;   // the id the file carries
    uint64_t table_checksum;  // its CheckpointReader::table_checksum()
};

inline std::string checkpoint_path(const std::string& directory, long long step) {
    return directory + "/checkpoint_" + std::to_string(step) + ".bin";
}
// shard file `file` of the checkpoint whose main file is `main_path` (file 0 is the main file itself)
inline std::string shard_path(const std::string& main_path, int file) {
    if (file == 0) return main_path;
    return main_path.substr(0, main_path.size() - 4) + ".shard" + std::to_string(file) + ".bin";  // drops ".bin"
}

// The files of a sharded checkpoint form a grid: for every pipeline rank p, tp rank t and ep rank x of the
// layout that saved it (P x T x X ranks), its S ZeRO shards k, file ((p T + t) X + x) S + k (file 0 is the
// main file). shard_file numbers a shard's file and shard_file_owner tells whose a file is; nothing else
// does that arithmetic.
struct ShardFileGrid {
    int pp = 1, tp = 1, ep = 1, shards = 1;
    int files() const { return pp * tp * ep * shards; }
};
struct ShardOwner {
    int pp_rank = 0, tp_rank = 0, ep_rank = 0, shard = 0;
};
inline int shard_file(const ShardFileGrid& grid, const ShardOwner& owner) {
    return ((owner.pp_rank * grid.tp + owner.tp_rank) * grid.ep + owner.ep_rank) * grid.shards + owner.shard;
}
inline ShardOwner shard_file_owner(const ShardFileGrid& grid, int file) {
    ShardOwner owner;
    owner.shard = file % grid.shards;
    owner.ep_rank = file / grid.shards % grid.ep;
    owner.tp_rank = file / (grid.shards * grid.ep) % grid.tp;
    owner.pp_rank = file / (grid.shards * grid.ep * grid.tp);
    return owner;
}

// The two sections every file of a checkpoint carries.
inline void add_checkpoint_identity(CheckpointWriter& writer, uint64_t checkpoint_id, long long step) {
    writer.add_value("checkpoint_id", checkpoint_id);
    writer.add_value("step", step);
}

// Stops with one line unless shard file `path` is the one the main file `main_path` lists as `entry`.
inline void check_shard_file(CheckpointReader& shard, const std::string& path, const std::string& main_path,
                             const ShardFileEntry& entry, long long step) {
    const uint64_t id = shard.read_value<uint64_t>("checkpoint_id");
    const long long saved_step = shard.read_value<long long>("step");
    if (id != entry.checkpoint_id || saved_step != step)
        fatal("%s belongs to another checkpoint (id %016llx, step %lld) than %s (id %016llx, step %lld): refusing "
              "to mix them", path.c_str(), (unsigned long long)id, saved_step, main_path.c_str(),
              (unsigned long long)entry.checkpoint_id, step);
    if (shard.table_checksum() != entry.table_checksum)
        fatal("%s is not the file %s lists (its section table differs): refusing to mix them", path.c_str(),
              main_path.c_str());
}

// The shard files the main file lists (after checking the main file's own step).
inline std::vector<ShardFileEntry> listed_shard_files(CheckpointReader& main, const std::string& main_path,
                                                      long long step) {
    if (main.read_value<long long>("step") != step)
        fatal("%s holds step %lld, not the step %lld its name says", main_path.c_str(),
              main.read_value<long long>("step"), step);
    const size_t bytes = main.bytes("shard_files");
    if (bytes % sizeof(ShardFileEntry) != 0) fatal("%s has a malformed list of shard files", main_path.c_str());
    std::vector<ShardFileEntry> entries(bytes / sizeof(ShardFileEntry));
    main.read("shard_files", entries.data(), bytes);
    const uint64_t id = main.read_value<uint64_t>("checkpoint_id");
    for (size_t i = 0; i < entries.size(); i++)
        if (entries[i].file != i + 1 || entries[i].checkpoint_id != id)
            fatal("%s has a malformed list of shard files", main_path.c_str());
    return entries;
}

// A file name of a checkpoint: checkpoint_<step>.bin (file 0) or checkpoint_<step>.shard<k>.bin, spelled
// exactly as checkpoint_path and shard_path write them (no leading zeros, no .tmp).
inline bool parse_checkpoint_name(const std::string& name, long long* step, long long* file) {
    const std::string prefix = "checkpoint_", suffix = ".bin";
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return false;
    std::string middle = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    auto number = [](const std::string& digits, long long* value) {
        if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos ||
            (digits.size() > 1 && digits[0] == '0'))
            return false;
        *value = std::stoll(digits);
        return true;
    };
    const size_t dot = middle.find(".shard");
    *file = 0;
    if (dot == std::string::npos) return number(middle, step);
    return number(middle.substr(0, dot), step) && number(middle.substr(dot + 6), file) && *file > 0;
}

// Every checkpoint file in the directory as (step, file), ascending. A directory that does not exist
// holds none.
inline std::vector<std::pair<long long, long long>> list_checkpoint_files(const std::string& directory) {
    std::vector<std::pair<long long, long long>> files;
    DIR* dir = opendir(directory.c_str());
    if (!dir) {
        if (errno == ENOENT) return files;
        fatal("cannot list directory %s: %s", directory.c_str(), strerror(errno));
    }
    while (struct dirent* entry = readdir(dir)) {
        long long step = 0, file = 0;
        if (parse_checkpoint_name(entry->d_name, &step, &file)) files.push_back({step, file});
    }
    closedir(dir);
    std::sort(files.begin(), files.end());
    return files;
}

// Steps that have a main file, ascending.
inline std::vector<long long> list_checkpoint_steps(const std::string& directory) {
    std::vector<long long> steps;
    for (auto [step, file] : list_checkpoint_files(directory))
        if (file == 0) steps.push_back(step);
    return steps;
}

// Why checkpoint `step` cannot be resumed from because its save did not finish ("" when it is complete).
// Stops with one line at a file that is present but does not belong to it.
inline std::string checkpoint_incomplete(const std::string& directory, long long step) {
    const std::string main_path = checkpoint_path(directory, step);
    if (!file_exists(main_path)) return "it has shard files but no main file " + main_path;
    CheckpointReader main(main_path);
    for (const ShardFileEntry& entry : listed_shard_files(main, main_path, step)) {
        const std::string path = shard_path(main_path, (int)entry.file);
        if (!file_exists(path)) return "its shard file " + path + " is missing";
        CheckpointReader shard(path);
        check_shard_file(shard, path, main_path, entry, step);
    }
    return "";
}

// The step of the newest complete checkpoint in the directory, or -1 when there is none. Each newer one
// that is incomplete is named in one line on stdout when `report` (one rank reports; every rank decides).
inline long long latest_checkpoint_step(const std::string& directory, bool report = false) {
    std::vector<long long> steps;
    for (auto [step, file] : list_checkpoint_files(directory))
        if (steps.empty() || steps.back() != step) steps.push_back(step);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        const std::string why = checkpoint_incomplete(directory, *it);
        if (why.empty()) return *it;
        if (report) printf("checkpoint of step %lld is incomplete (%s): skipped\n", *it, why.c_str());
    }
    return -1;
}

// Call after the main file of step `newest` is committed: removes every checkpoint file of the steps
// before it other than the newest `keep_last` that have a main file (`newest` among them), the main files
// first, so a checkpoint interrupted here is merely incomplete. Files of a save that never finished go too.
// Steps after `newest` are left alone: a future this run abandoned by resuming before it (its checkpoints
// were incomplete), which the run's next saves overwrite one by one.
inline void remove_old_checkpoints(const std::string& directory, int keep_last, long long newest) {
    if (keep_last < 1) fatal("remove_old_checkpoints: keep_last must be at least 1, got %d", keep_last);
    std::vector<long long> mains;
    for (long long step : list_checkpoint_steps(directory))
        if (step <= newest) mains.push_back(step);
    const long long oldest_kept = mains.size() > (size_t)keep_last ? mains[mains.size() - keep_last] : -1;
    auto removed = [&](long long step) {
        return step < newest && (step < oldest_kept || std::find(mains.begin(), mains.end(), step) == mains.end());
    };
    const std::vector<std::pair<long long, long long>> files = list_checkpoint_files(directory);
    for (bool main_files : {true, false})
        for (auto [step, file] : files) {
            if (!removed(step) || (file == 0) != main_files) continue;
            const std::string path = shard_path(checkpoint_path(directory, step), (int)file);
            if (remove(path.c_str()) != 0) fatal("cannot remove old checkpoint file %s: %s", path.c_str(), strerror(errno));
        }
}

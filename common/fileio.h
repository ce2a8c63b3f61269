/* Small file helpers with the error messages users need: whole-file reads, atomic writes, checksums of
 * whole files, fsync of directories and removal of flat directories. */
#ifndef ZT_COMMON_FILEIO_H
#define ZT_COMMON_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Reads a whole file into a NUL-terminated malloc'd buffer (*out, freed by the caller; *len excludes
 * the NUL). Returns 0 or a negative errno with "cannot read PATH: reason" in err. */
int zt_read_file(const char *path, char **out, size_t *len, zt_err *err);

/* Writes len bytes to path atomically: path.tmp, fsync, rename, fsync of the directory. On failure no
 * file is left behind and a negative errno is returned with the path and the reason in err. */
int zt_write_file_atomic(const char *path, const void *data, size_t len, zt_err *err);

/* One piece of a file written by zt_write_file_atomic_parts; data is borrowed for the call. */
typedef struct zt_file_part {
    const void *data; /* may be NULL when len is 0 */
    size_t len;       /* bytes */
} zt_file_part;

/* Like zt_write_file_atomic, for a file made of nparts pieces written one after the other (a header
 * and tensors, say) without first copying them into one buffer. */
int zt_write_file_atomic_parts(const char *path, const zt_file_part *parts, size_t nparts, zt_err *err);

/* Writes len bytes of data at byte offset of the open file fd (pwrite until done). Returns 0 or a negative
 * errno (no message: the caller names the file). */
int zt_pwrite_all(int fd, const void *data, size_t len, uint64_t offset);

/* fsyncs directory dir, so that files created, renamed or removed in it stay so after a crash. A file
 * system that cannot fsync directories (EINVAL) counts as success. Returns 0 or a negative errno with a
 * message naming dir. */
int zt_fsync_dir(const char *dir, zt_err *err);

/* zt_fsync_dir of the directory that holds path: the part before its last '/', "/" for a name in the
 * root, "." for a name without '/'. Returns 0 or a negative errno with a message naming the directory
 * (or path, when it is too long). */
int zt_fsync_parent_dir(const char *path, zt_err *err);

/* Creates a directory and its parents (like mkdir -p). Returns 0 or a negative errno with a message. */
int zt_mkdir_p(const char *path, zt_err *err);

/* Checks that dir exists (or can be created) and that a file can be created in it, so that a long run
 * fails at start rather than at its first checkpoint. Returns 0 or a negative errno with a message. */
int zt_check_writable_dir(const char *dir, zt_err *err);

/* Reads all of path and sets *bytes to its size and *crc to its CRC-32C (common/crc32c.h), as written in
 * the manifests of checkpoints and snapshots. Returns 0, or a negative errno with a message naming the
 * file (then *bytes and *crc cover what was read before the error). */
int zt_checksum_file(const char *path, uint64_t *bytes, uint32_t *crc, zt_err *err);

/* Removes a directory that holds only plain files (a checkpoint, a snapshot or its .tmp), files first.
 * A missing directory is fine; other errors are ignored, as this only cleans up. */
void zt_remove_flat_dir(const char *dir);

#endif

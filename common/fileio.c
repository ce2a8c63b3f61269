/* Whole-file reads, atomic writes (temp file, fsync, rename, fsync of the directory), mkdir -p, a
 * writability probe, whole-file checksums, fsync of directories and removal of flat directories, each failing with a message
 * that names the path and the reason. */
#include "common/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"

/* Reads all of path into a NUL-terminated malloc'd buffer; see fileio.h. */
int zt_read_file(const char *path, char **out, size_t *len, zt_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot read %s: %s", path, strerror(e));
    }
    struct stat st;
    size_t cap = 4096;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        cap = (size_t)st.st_size + 1;
    char *buf = malloc(cap);
    if (buf == NULL) {
        close(fd);
        return zt_fail(err, -ENOMEM, "cannot read %s: out of memory for %zu bytes", path, cap);
    }
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) { /* the file grew, or it is not a regular file: grow the buffer */
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                close(fd);
                return zt_fail(err, -ENOMEM, "cannot read %s: out of memory for %zu bytes", path, cap * 2);
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return zt_fail(err, -e, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len != NULL)
        *len = n;
    return 0;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Writes len bytes at offset of fd, however many pwrite calls it takes; see fileio.h. */
int zt_pwrite_all(int fd, const void *data, size_t len, uint64_t offset)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        p += w;
        len -= (size_t)w;
        offset += (uint64_t)w;
    }
    return 0;
}

/* fsync of a directory, so that the entries created or renamed in it survive a crash; see fileio.h. */
int zt_fsync_dir(const char *dir, zt_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot open directory %s to sync it: %s", dir, strerror(e));
    }
    int rc = 0;
    /* Some file systems cannot fsync a directory (EINVAL): the entries are as durable as they allow. */
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = -errno;
    close(fd);
    if (rc != 0)
        return zt_fail(err, rc, "cannot sync directory %s: %s", dir, strerror(-rc));
    return 0;
}

/* fsync of the directory that holds path ("." for a bare name, "/" for a name in the root); see fileio.h. */
int zt_fsync_parent_dir(const char *path, zt_err *err)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof(dir))
            return zt_fail(err, -ENAMETOOLONG, "cannot sync the directory of %s: path too long", path);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return zt_fsync_dir(dir, err);
}

/* Writes the parts to path.tmp, fsyncs, renames over path and fsyncs the directory; see fileio.h. */
int zt_write_file_atomic_parts(const char *path, const zt_file_part *parts, size_t nparts, zt_err *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return zt_fail(err, -ENAMETOOLONG, "cannot write %s: path too long", path);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot write %s: cannot create %s: %s", path, tmp, strerror(e));
    }
    int rc = 0;
    const char *step = "write";
    for (size_t i = 0; i < nparts && rc == 0; i++)
        if (parts[i].len > 0)
            rc = write_all(fd, parts[i].data, parts[i].len);
    if (rc == 0) {
        step = "fsync";
        if (fsync(fd) != 0)
            rc = -errno;
    }
    if (close(fd) != 0 && rc == 0) {
        step = "close";
        rc = -errno;
    }
    if (rc == 0) {
        step = "rename";
        if (rename(tmp, path) != 0)
            rc = -errno;
    }
    if (rc != 0) {
        unlink(tmp);
        return zt_fail(err, rc, "cannot write %s: %s of %s failed: %s", path, step, tmp, strerror(-rc));
    }
    rc = zt_fsync_parent_dir(path, NULL);
    if (rc != 0)
        return zt_fail(err, rc, "cannot write %s: the file was renamed into place but fsync of its directory failed: %s",
                       path, strerror(-rc));
    return 0;
}

/* Writes len bytes to path atomically; see fileio.h. */
int zt_write_file_atomic(const char *path, const void *data, size_t len, zt_err *err)
{
    zt_file_part part = {data, len};
    return zt_write_file_atomic_parts(path, &part, 1, err);
}

/* Creates one directory; an existing directory is fine, an existing file of another kind is not. */
static int mkdir_one(const char *path)
{
    if (mkdir(path, 0755) == 0)
        return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST) {
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
        return -ENOTDIR;
    }
    /* mkdir reports EACCES for an existing directory inside one we cannot write to: that is fine. */
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    return -e;
}

/* Creates path and its missing parents, like mkdir -p; see fileio.h. */
int zt_mkdir_p(const char *path, zt_err *err)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0)
        return zt_fail(err, -ENOENT, "cannot create directory '': empty path");
    if (n >= sizeof(buf))
        return zt_fail(err, -ENAMETOOLONG, "cannot create directory '%s': path too long", path);
    memcpy(buf, path, n + 1);
    /* Create each prefix that ends before a '/', then the whole path. */
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        if (buf[i - 1] == '/') /* repeated or trailing slashes */
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        int rc = mkdir_one(buf);
        if (rc != 0) {
            if (strcmp(buf, path) == 0)
                return zt_fail(err, rc, "cannot create directory '%s': %s", path, strerror(-rc));
            return zt_fail(err, rc, "cannot create directory '%s': cannot create '%s': %s", path, buf, strerror(-rc));
        }
        buf[i] = saved;
    }
    return 0;
}

/* Creates dir if needed, then creates and removes a probe file in it; see fileio.h. */
int zt_check_writable_dir(const char *dir, zt_err *err)
{
    zt_err inner;
    int rc = zt_mkdir_p(dir, &inner);
    if (rc != 0)
        return zt_fail(err, rc, "cannot write to output directory '%s': %s (choose another --out or fix its permissions)",
                       dir, strerror(-rc));
    char probe[PATH_MAX];
    if (snprintf(probe, sizeof(probe), "%s/.ztrain-write-probe-%ld", dir, (long)getpid()) >= (int)sizeof(probe))
        return zt_fail(err, -ENAMETOOLONG, "cannot write to output directory '%s': path too long", dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot write to output directory '%s': %s (choose another --out or fix its permissions)",
                       dir, strerror(e));
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* Size and CRC-32C of a whole file; see fileio.h. */
int zt_checksum_file(const char *path, uint64_t *bytes, uint32_t *crc, zt_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zt_fail(err, -errno, "cannot open %s: %s", path, strerror(errno));
    size_t cap = (size_t)1 << 20;
    char *buf = zt_xmalloc(cap);
    uint32_t c = 0;
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            rc = zt_fail(err, -errno, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (k == 0)
            break;
        c = zt_crc32c(c, buf, (size_t)k);
        total += (uint64_t)k;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = c;
    return rc;
}

/* Removes a directory of plain files; see fileio.h. */
void zt_remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < (int)sizeof(path))
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

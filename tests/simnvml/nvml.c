/* A simulated NVML: libnvidia-ml.so.1 for machines without a GPU.
 *
 * It exports the NVML functions gpu-mem calls, with the real signatures and
 * struct layouts (nvml.h), and answers from what the simulated driver
 * (tests/simcuda) publishes: each process that loaded it with SIMNVML_DIR
 * set writes SIMNVML_DIR/PID, one line per device it made a context on,
 * "DEVICE BYTES", the bytes NVML would say it uses there. A process whose
 * file is left but which is gone is not listed, as NVML lists running
 * processes only. There are SIMCUDA_DEVICES devices (default 1) of
 * SIMCUDA_CAPACITY bytes (default 80 GiB), of which SIMNVML_RESERVED_BYTES
 * (default 0) the driver reserves; a device's used memory is what its
 * processes use. Without SIMNVML_DIR, nvmlInit_v2 fails as on a machine
 * without the NVIDIA driver.
 */
#include "nvml.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 16
#define MAX_PROCESSES 256

struct nvmlDevice_st {
	unsigned int index;
};

static struct nvmlDevice_st devices[MAX_DEVICES];
static int initialized;

struct usage {
	unsigned int pid;
	unsigned long long bytes;
};

static unsigned int device_count(void)
{
	const char *env = getenv("SIMCUDA_DEVICES");
	int n = env ? atoi(env) : 1;
	return n < 1 || n > MAX_DEVICES ? 1 : (unsigned int)n;
}

static unsigned long long env_bytes(const char *name, unsigned long long def)
{
	const char *env = getenv(name);
	return env ? strtoull(env, NULL, 0) : def;
}

static int alive(int pid)
{
	return kill(pid, 0) == 0 || errno == EPERM;
}

/* usages reads the running processes' use of device index into out, at
 * most max; it returns how many there are. */
static unsigned int usages(unsigned int index, struct usage *out, unsigned int max)
{
	const char *dir = getenv("SIMNVML_DIR");
	DIR *d = dir && *dir ? opendir(dir) : NULL;
	if (!d)
		return 0;
	unsigned int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (!isdigit((unsigned char)e->d_name[0]) || *end || !alive((int)pid))
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		unsigned int dev;
		unsigned long long bytes;
		while (fscanf(f, "%u %llu", &dev, &bytes) == 2) {
			if (dev != index)
				continue;
			if (n < max)
				out[n] = (struct usage){.pid = (unsigned int)pid, .bytes = bytes};
			n++;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

static int valid(nvmlDevice_t device)
{
	return initialized && device >= devices && device < devices + device_count();
}

nvmlReturn_t nvmlInit_v2(void)
{
	const char *dir = getenv("SIMNVML_DIR");
	if (!dir || !*dir)
		return NVML_ERROR_DRIVER_NOT_LOADED;
	for (unsigned int i = 0; i < MAX_DEVICES; i++)
		devices[i].index = i;
	initialized++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	initialized--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED:
		return "Driver Not Loaded";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
		return "Argument Version Mismatch";
	}
	return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!version)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((unsigned int)snprintf(version, length, "simulated") >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!deviceCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	*deviceCount = device_count();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!device || index >= device_count())
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &devices[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	if (!valid(device) || !index)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = device->index;
	return NVML_SUCCESS;
}

/* The simulated GPUs' UUIDs: GPU-00000000-0000-4000-8000-00000000000N for
 * index N, as tests/gpus (a /proc/driver/nvidia/gpus) describes them. */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	if (!valid(device) || !uuid)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((unsigned int)snprintf(uuid, length, "GPU-00000000-0000-4000-8000-%012x", device->index) >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

/* device_used is what the device's running processes use. */
static unsigned long long device_used(nvmlDevice_t device)
{
	struct usage u[MAX_PROCESSES];
	unsigned int n = usages(device->index, u, MAX_PROCESSES);
	unsigned long long used = 0;
	for (unsigned int i = 0; i < n && i < MAX_PROCESSES; i++)
		used += u[i].bytes;
	return used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	if (!valid(device) || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	memory->total = env_bytes("SIMCUDA_CAPACITY", 80ULL << 30);
	memory->used = device_used(device) + env_bytes("SIMNVML_RESERVED_BYTES", 0);
	memory->free = memory->total - memory->used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	if (!valid(device) || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	memory->total = env_bytes("SIMCUDA_CAPACITY", 80ULL << 30);
	memory->reserved = env_bytes("SIMNVML_RESERVED_BYTES", 0);
	memory->used = device_used(device);
	memory->free = memory->total - memory->reserved - memory->used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos)
{
	if (!valid(device) || !infoCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct usage u[MAX_PROCESSES];
	unsigned int n = usages(device->index, u, MAX_PROCESSES);
	if (n > MAX_PROCESSES)
		return NVML_ERROR_UNKNOWN;
	if (n > *infoCount || (n > 0 && !infos)) {
		*infoCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (unsigned int i = 0; i < n; i++)
		infos[i] = (nvmlProcessInfo_t){
			.pid = u[i].pid,
			.usedGpuMemory = u[i].bytes,
			.gpuInstanceId = 0xFFFFFFFF, /* no MIG */
			.computeInstanceId = 0xFFFFFFFF,
		};
	*infoCount = n;
	return NVML_SUCCESS;
}

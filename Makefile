# Tandem: speculative-decoding inference engine for DeepSeek-V4-class models.
#   make            build bin/tandem (CUDA sources too when nvcc is found)
#   make test       CPU tests, then the unit tests again under ASan + UBSan
#   make test-cpu   CPU tests only (no sanitizers)
#   make format     clang-format every C/CUDA source
#   make SANITIZER=address,undefined ...   sanitized build in build-san/
MAKEFLAGS += -r
CC      ?= cc
NVCC    ?= nvcc
CUARCH  ?= sm_90a
BUILD   ?= build
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_DEFAULT_SOURCE -I. -MMD -MP
LDLIBS  += -ljansson -lm -lpthread

ifneq ($(SANITIZER),)
BUILD   := build-san
CFLAGS  += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZER)
endif

HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(HAVE_NVCC),)
$(info ✗ nvcc not found, building CPU-only)
CU_SRC :=
else
CU_SRC := $(wildcard kernels/*.cu)
NVFLAGS := -std=c++17 -O3 -g -lineinfo -arch=$(CUARCH) -I.
ifneq ($(CU_SRC),)
LDLIBS  += -lcudart -lcublasLt -lcublas
CFLAGS  += -DTD_HAVE_CUDA=1
endif
endif

LIB_SRC  := $(wildcard engine/*.c kernels/*.c metadata/*.c draft/*.c verify/*.c)
LIB_SRC  := $(filter-out engine/main.c,$(LIB_SRC))
LIB_OBJ  := $(LIB_SRC:%=$(BUILD)/%.o) $(CU_SRC:%=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: bin/tandem

bin/tandem: $(BUILD)/engine/main.c.o $(BUILD)/libtandem.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libtandem.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.c.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%: $(BUILD)/tests/%.c.o $(BUILD)/libtandem.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

tests: $(TEST_BIN)

# every test binary prints OK/FAIL lines; tests/run.sh sums them into "N passed, N failed"
test-cpu: bin/tandem $(TEST_BIN)
	@sh tests/run.sh $(BUILD) $(TEST_BIN)

test: test-cpu
	@$(MAKE) --no-print-directory SANITIZER=address,undefined test-san

test-san: $(TEST_BIN) $(BUILD)/tandem
	@ASAN_OPTIONS=detect_leaks=1 TD_TEST_QUICK=1 TD_TANDEM=$(BUILD)/tandem sh tests/run.sh $(BUILD) $(TEST_BIN)

$(BUILD)/tandem: $(BUILD)/engine/main.c.o $(BUILD)/libtandem.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

format:
	clang-format -i $(wildcard */*.c */*.h */*.cu)

clean:
	rm -rf build build-san bin

.PHONY: all tests test test-cpu test-san format clean
.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
